"""One rule for a list of protocols, in `compare --protocols` and `simulate --protocol ... --sweep`."""

import pytest

from hetrain.cli import main
from hetrain.commands.run_options import parse_protocols
from hetrain.errors import UsageError
from hetrain.registry import PROTOCOL_NAMES


def test_a_comma_list_and_all():
    assert parse_protocols("hop, prague", "--protocols") == ["hop", "prague"]
    assert parse_protocols("all", "--protocols") == list(PROTOCOL_NAMES)


@pytest.mark.parametrize("text, says", [("hop,hop", "lists hop twice"), ("", "names no protocol"),
                                         (" , ", "names no protocol"), ("hop,nope", "unknown protocol 'nope'")])
def test_bad_lists_are_refused_naming_the_flag(text, says):
    with pytest.raises(UsageError, match=says) as caught:
        parse_protocols(text, "--protocols")
    assert "--protocols" in str(caught.value)


@pytest.mark.parametrize("argv", [["compare", "--protocols", "hop,hop"],
                                  ["simulate", "--protocol", "hop,hop", "--sweep", "workers=4", "--iterations", "2"]])
def test_both_commands_refuse_a_repeated_protocol_writing_nothing(tmp_path, capsys, argv):
    out = tmp_path / "out"
    assert main(argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "hop twice" in err and len(err.splitlines()) == 1 and not out.exists()
