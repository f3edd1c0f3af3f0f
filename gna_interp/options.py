"""Options as small frozen dataclasses: checked on construction, typos named with the closest valid field.

Every configurable entry point (``patterns``, ``scan_heads``, ``discover``, ...) takes one of these,
or keyword overrides of its fields. ``ScanConfig(fomr=...)`` and ``scan_heads(..., fomr=...)`` both
raise :class:`~gna_interp.errors.OptionError` naming ``form``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import numbers
from typing import Any, Iterable, TypeVar

from gna_interp.constants import N_BOOT_MAX
from gna_interp.errors import OptionError

T = TypeVar("T", bound="Options")


def check_names(given: Iterable[str], valid: Iterable[str], where: str) -> None:
    """Raise :class:`OptionError` for the first name of ``given`` that is not in ``valid``, naming the
    closest valid one."""
    valid = list(valid)
    for name in given:
        if name not in valid:
            close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise OptionError(f"{where} has no option {name!r}{hint} Valid options: {', '.join(sorted(valid))}")


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
    """Raise :class:`OptionError` unless ``value`` is one of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        raise OptionError(f"unknown {name}: {name}={value!r}; choose one of {choices}")


def check_int(name: str, value: Any, minimum: int | None = None, allow_none: bool = False) -> None:
    """Raise :class:`OptionError` unless ``value`` is an int (not a bool) ``>= minimum``."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise OptionError(f"{name} must be >= {minimum}, got {value}")




def check_n_boot(value: Any, name: str = "n_boot") -> int:
    """``value`` as a number of bootstrap resamples, ``1..N_BOOT_MAX``; :class:`OptionError` otherwise."""
    check_int(name, value, 1)
    if value > N_BOOT_MAX:
        raise OptionError(f"{name} must be <= {N_BOOT_MAX} (resamples of an interval), got {value}")
    return int(value)


def check_level(value: Any, name: str = "level") -> float:
    """``value`` as an interval's confidence level, strictly between 0 and 1; :class:`OptionError` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise OptionError(f"{name} must be a number strictly between 0 and 1, got {value!r}")
    return float(value)


def check_share(value: Any, name: str) -> float:
    """``value`` as a share in [0, 1) (a fraction of a size); :class:`OptionError` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise OptionError(f"{name} must be a share in [0, 1), got {value!r}")
    return float(value)


def check_counts(owner: Any, minimums: dict[str, int]) -> None:
    """Raise :class:`OptionError` naming the first field of ``owner`` in ``minimums`` that is not an int (not a
    bool) at least its minimum: ``NAME must be an integer >= MIN, got VALUE``."""
    for name, lo in minimums.items():
        v = getattr(owner, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise OptionError(f"{name} must be an integer >= {lo}, got {v!r}")


def check_pairs_fit(pairs: int, max_value: int, pairs_name: str = "pairs", max_name: str = "max_value") -> None:
    """Refuse ``max_value + 1 < pairs`` (:class:`OptionError`): every line of a KV dictionary needs its own value
    in ``0..max_value``. The message names the options as ``pairs_name`` and ``max_name`` (``--pairs``, ...)."""
    if max_value + 1 < pairs:
        raise OptionError(f"{max_name} {max_value} gives {max_value + 1} distinct values, fewer than {pairs_name} "
                          f"{pairs}: every line needs its own value; raise {max_name} or lower {pairs_name}")


def options(cls: type[T]) -> type[T]:
    """Class decorator: a frozen dataclass whose constructor names the closest field for a typo."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    init = cls.__init__
    names = [f.name for f in dataclasses.fields(cls)]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        check_names(kwargs, names, cls.__name__)
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


@dataclasses.dataclass(frozen=True)
class Options:
    """Base of the option dataclasses (declare subclasses with :func:`options`); :meth:`validate` runs
    on construction."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the values; raise :class:`OptionError` with what is wrong. Subclasses override."""

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The option names."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def build(cls: type[T], base: T | None = None, **overrides: Any) -> T:
        """``base`` (default: all defaults) with ``overrides``; unknown names raise naming the closest."""
        check_names(overrides, cls.field_names(), cls.__name__)
        if base is not None and not isinstance(base, cls):
            raise OptionError(f"expected a {cls.__name__}, got {type(base).__name__}")
        return dataclasses.replace(base, **overrides) if base is not None else cls(**overrides)

    def replace(self: T, **overrides: Any) -> T:
        """A copy with ``overrides`` (checked like the constructor)."""
        return type(self).build(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        """The options as a plain dict (values as given)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
