"""rlcore.interfaces.key: a config key is an attrs field carrying the same metadata as by hand."""

import attrs
import pytest

from rlcore.interfaces import key


@attrs.frozen(kw_only=True)
class _ByKey:
    n: int = key(2, "Rows.", validator=attrs.validators.ge(1))
    path: str = key(help="A folder.", shown_default="model.path")
    names: dict[str, int] = key(factory=dict, help="Name -> count.", allowed="names")


@attrs.frozen(kw_only=True)
class _ByHand:
    n: int = attrs.field(default=2, validator=attrs.validators.ge(1), metadata={"help": "Rows."})
    path: str = attrs.field(metadata={"help": "A folder.", "default": "model.path"})
    names: dict[str, int] = attrs.field(
        factory=dict, metadata={"help": "Name -> count.", "allowed": "names"}
    )


def test_key_is_the_hand_written_field() -> None:
    for a, b in zip(attrs.fields(_ByKey), attrs.fields(_ByHand), strict=True):
        assert (a.name, a.default, a.metadata) == (b.name, b.default, b.metadata)
        assert repr(a.validator) == repr(b.validator)
    assert _ByKey(path="p") == _ByKey(path="p", n=2, names={})
    with pytest.raises(ValueError, match="n"):
        _ByKey(path="p", n=0)
    with pytest.raises(TypeError):
        _ByKey()  # type: ignore[call-arg]  # path is required


def test_key_needs_help_text() -> None:
    with pytest.raises(TypeError, match="help"):
        key(1)
