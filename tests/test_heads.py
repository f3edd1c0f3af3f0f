import pytest

from gna_interp import HeadRef
from gna_interp.errors import HeadError
from gna_interp.models.heads import parse_heads


@pytest.mark.parametrize("name,expected", [
    ("L16H22", HeadRef(16, 22, "attn")),
    ("L3S5", HeadRef(3, 5, "ssm2")),
    ("L35C3186", HeadRef(35, 3186, "ssm1")),
    ("L35C3184+8", HeadRef(35, 3184, "ssm1", 8)),
])
def test_names_round_trip(name, expected):
    assert HeadRef.parse(name) == expected
    assert expected.name == name
    assert HeadRef.parse(expected.name) == expected


def test_parse_list_and_order():
    heads = parse_heads("L2H1, L0S3,L1C7")
    assert [h.name for h in heads] == ["L2H1", "L0S3", "L1C7"]
    assert sorted(heads)[0].layer == 0
    assert HeadRef(0, 3, "ssm1", 4).channels == range(3, 7)


@pytest.mark.parametrize("bad", ["L1X2", "H3", "L1H", "layer1head2", "L-1H2", "L1H2+3", ""])
def test_malformed_names_raise_clear_errors(bad):
    with pytest.raises(HeadError, match="malformed head name|only meaningful"):
        HeadRef.parse(bad)


def test_bad_fields():
    with pytest.raises(HeadError, match="unknown head kind"):
        HeadRef(0, 0, "mlp")  # type: ignore[arg-type]
    with pytest.raises(HeadError, match="width"):
        HeadRef(0, 0, "attn", 2)
