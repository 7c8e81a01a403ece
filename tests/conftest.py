"""Shared pytest fixtures live in tests/fixtures/; each module is one plugin."""

pytest_plugins = [
    "tests.fixtures.apiserver",
    "tests.fixtures.kube",
    "tests.fixtures.logs",
    "tests.fixtures.tls",
]
