from __future__ import annotations

import pytest

from kokoro_contract import blends
from kokoro_contract.errors import InvalidRequest
from kokoro_contract.limits import check_voice

VOICES = frozenset({"af_bella", "af_sky", "jm_kumo", "jf_alpha"})


@pytest.mark.parametrize(
    ("asked", "name"),
    [
        ("af_bella(2)+af_sky(1)", "af_bella(2)+af_sky(1)"),
        ("af_sky(1) + af_bella(2)", "af_bella(2)+af_sky(1)"),  # any order, spaces
        ("af_bella(4)+af_sky(2)", "af_bella(2)+af_sky(1)"),  # the same ratio
        ("af_bella+af_sky", "af_bella(1)+af_sky(1)"),  # no weight: 1
        (["af_bella(3)", "af_sky"], "af_bella(3)+af_sky(1)"),  # the same as a list
        ("af_bella(.5)+jm_kumo(.5)+jf_alpha(1)", "af_bella(1)+jf_alpha(2)+jm_kumo(1)"),
        ("af_bella(0.3)+af_sky(0.7)", "af_bella(1)+af_sky(2.33333)"),
        ("af_bella(2)", "af_bella"),  # one voice is that voice
        ("jm_kumo", "jm_kumo"),  # not a blend at all
    ],
)
def test_a_blend_is_checked_into_its_canonical_name(asked: object, name: str) -> None:
    assert check_voice(asked, VOICES, "jf_alpha") == name


@pytest.mark.parametrize(
    ("asked", "code", "says"),
    [
        ("af_bella(2)+nobody(1)", "unknown_voice", "unknown voice 'nobody' in the blend"),
        ("af_bella(0)+af_sky", "invalid_voice", "af_bella's weight must be above 0"),
        ("af_bella(101)+af_sky", "invalid_voice", "at most 100"),
        ("af_bella(-1)+af_sky", "invalid_voice", "'af_bella(-1)' is not a voice"),
        ("af_bella(x)+af_sky", "invalid_voice", "is not a voice with an optional (weight)"),
        ("af_bella++af_sky", "invalid_voice", "'' is not a voice"),
        ("af_bella+af_bella", "invalid_voice", "af_bella is named twice"),
        ("a+b+c+d+e", "invalid_voice", "at most 4 voices"),
        ([], "invalid_field", "a blend's voice names as a list"),
        (["af_bella", 3], "invalid_field", "a blend's voice names as a list"),
    ],
)
def test_a_bad_blend_is_refused_saying_why(asked: object, code: str, says: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        check_voice(asked, VOICES, "jf_alpha")
    assert refused.value.code == code
    assert says in refused.value.message


def test_a_blends_canonical_name_reads_back_as_itself() -> None:
    blend = blends.parse_blend("jf_alpha(1)+jm_kumo(2)+af_sky(3)")
    assert blends.parse_blend(blend.name) == blend
    assert blend.shares == (("af_sky", 0.5), ("jf_alpha", 1 / 6), ("jm_kumo", 1 / 3))
