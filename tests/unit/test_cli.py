from click.testing import CliRunner

from hamid import __version__
from hamid.cli import cli


def test_help_lists_every_mode() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for mode in ("scheduler", "plugin", "demo", "sim", "doctor", "version"):
        assert mode in result.output


def test_version() -> None:
    result = CliRunner().invoke(cli, ["version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"hamid {__version__}"
