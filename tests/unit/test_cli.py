import sys
import tomllib
from pathlib import Path

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


class _Absent:
    """An import finder that hides the simulator package, as a production install lacks it."""

    def find_spec(self, fullname: str, *_: object) -> None:
        if fullname.split(".")[0] == "hamidsim":
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)


def test_without_the_simulator_demo_and_sim_say_in_one_line_what_to_install(monkeypatch) -> None:
    for name in [m for m in sys.modules if m == "hamidsim" or m.startswith("hamidsim.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_Absent(), *sys.meta_path])  # as on a production install
    for command in ("demo", "sim"):
        result = CliRunner().invoke(cli, [command, "--help"])
        assert result.exit_code == 2
        message = [line for line in result.output.splitlines() if line.startswith("Error:")]
        assert message == [
            f"Error: `hamid {command}` needs the simulator, which is not installed: "
            "pip install ./sim from a hamid checkout (or use the image's demo target)"
        ]


def test_the_production_distribution_ships_no_simulator() -> None:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["packages"]["find"]["include"] == ["hamid", "hamid.*"]
    assert not any("sim" in entry for entry in pyproject["tool"]["setuptools"]["package-data"]["hamid"])


def test_a_kubeconfig_to_read_and_one_to_write_never_share_an_env_var() -> None:
    """A docs audit: ``HAMID_KUBECONFIG`` was the kubeconfig ``status``/``scheduler``/``plugin``
    read and the file ``demo --keep``/``sim up``/``sim apiserver`` wrote, so the demo overwrote an
    operator's real kubeconfig. The simulator's commands write ``--write-kubeconfig``."""
    writers = (["demo"], ["sim", "up"], ["sim", "apiserver"])
    for args in writers:
        out = CliRunner().invoke(cli, [*args, "--help"], terminal_width=200).output
        assert "--write-kubeconfig" in out and "HAMID_WRITE_KUBECONFIG" in out, args
        assert "HAMID_KUBECONFIG" not in out, args
    for args in (["status"], ["scheduler"], ["plugin"]):
        out = CliRunner().invoke(cli, [*args, "--help"], terminal_width=200).output
        assert "HAMID_KUBECONFIG" in out and "--write-kubeconfig" not in out, args


def test_a_required_option_left_out_is_a_usage_error_not_a_traceback() -> None:
    result = CliRunner().invoke(cli, ["plugin"], env={"NODE_NAME": None, "HAMID_NODE_NAME": None})
    assert result.exit_code == 2 and "Missing option '--node-name'" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
