"""Error kinds are defined once, in C++; Python maps them to exception classes by name."""
import pytest

import rdmadev
from rdmadev import _core, errors


def test_every_native_kind_maps_to_its_own_class():
    kinds = _core.error_kinds()
    assert len(kinds) >= 9 and len(set(kinds.values())) == len(kinds)
    classes = [errors.class_for_kind(v) for v in kinds.values()]
    assert len(set(classes)) == len(classes)
    for cls in classes:
        assert issubclass(cls, errors.RdmadevError) and cls is not errors.RdmadevError
    assert set(errors.CLASS_BY_KIND_NAME) == set(kinds)


def test_a_native_error_arrives_as_its_class():
    with pytest.raises(rdmadev.ConfigError, match="slots = 0"):
        rdmadev.RingLayout(0, 128, 64, 64)


def test_an_unknown_native_kind_is_refused_at_bind():
    with pytest.raises(ImportError, match="rdmadev/errors.py"):
        errors._bind_native_kinds({**_core.error_kinds(), "brand_new": 99})
    assert errors.class_for_kind(_core.error_kinds()["closed"]) is rdmadev.ClosedError
