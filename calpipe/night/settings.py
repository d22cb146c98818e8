"""The chain's configuration: the calibrator a chain runs, built once.

:class:`Settings` is a method name and its parameters, with the fingerprint that the state of
every day records; it builds its calibrator once (:meth:`Settings.calibrator`), and every engine
call of a run gets that object.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from dataclasses import dataclass
from typing import Any

from calpipe import config
from calpipe.calibrators import Calibrator, make_calibrator
from calpipe.errors import ParameterError


@dataclass(frozen=True)
class Settings:
    """The calibrator a chain runs: a method name and its parameters (validated on use).

    The pipeline runs every method of :data:`calpipe.calibrators.METHODS`
    (:data:`calpipe.config.PIPELINE_DEFAULT_METHOD` by default, ``composite-experts``) on the
    forecasts a database stores (binary, or K classes for the methods that take them:
    :mod:`calpipe.pipeline.classes`), and stacks (``base_method``/``base_params``), in either
    loss (``loss="brier"``: the Brier compatibility mode). The SQL serving map (``calibration_map``) exists for every
    binary method with a SQL form (:func:`calpipe.night.mapping.has_sql_map`); the others
    serve through :func:`serving_map`.

    >>> Settings().fingerprint == Settings.from_json(Settings().to_json()).fingerprint
    True
    """

    method: str = config.PIPELINE_DEFAULT_METHOD
    params: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def make(cls, method: str = config.PIPELINE_DEFAULT_METHOD, **params) -> Settings:
        s = cls(method, tuple(sorted((k, _freeze(v)) for k, v in params.items())))
        s.calibrator()  # validate now
        return s

    @property
    def kwargs(self) -> dict[str, Any]:
        kw = dict(self.params)
        if kw.get("base_params") is not None:
            kw["base_params"] = dict(kw["base_params"])
        return kw

    def calibrator(self, n_classes: int = 2) -> Calibrator:
        """The calibrator, checked to take forecasts of ``n_classes`` classes: built once per
        :class:`Settings` and handed as an object to every engine call of a run (a 4-day run
        built the same ``CompositeExperts`` five times when each layer made its own)."""
        self._built.check_classes(n_classes)
        return self._built

    @functools.cached_property
    def _built(self) -> Calibrator:
        # a frozen dataclass's cached_property: stored in the instance __dict__, not a field
        # (equality, hashing and to_json see only method and params)
        return make_calibrator(self.method, **self.kwargs)

    @property
    def fingerprint(self) -> str:
        """The fingerprint of the binary chain (:meth:`fingerprint_for` K classes)."""
        return self.fingerprint_for(2)

    def fingerprint_for(self, n_classes: int) -> str:
        """The config fingerprint a chain of ``n_classes``-class forecasts records."""
        return self.calibrator(n_classes).fingerprint(n_classes)

    def to_json(self) -> str:
        return json.dumps({"method": self.method, "params": self.kwargs}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, *, source: str = "settings") -> Settings:
        """Settings from their JSON (``to_json``); ParameterError naming ``source`` (e.g. the
        environment variable) if the text is not a JSON object of a method and its params."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ParameterError(f"{source}: not valid JSON ({exc}): {text[:80]!r}") from None
        if not isinstance(d, dict) or not isinstance(d.get("params", {}), dict):
            raise ParameterError(
                f'{source}: expected {{"method": NAME, "params": {{...}}}}, got {text[:80]!r}'
            )
        # records written before the method was stored meant the Composite Jumper (the default then)
        return cls.make(d.get("method", "composite-jumper"), **d.get("params", {}))


def _freeze(v):
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, list | tuple):
        return tuple(_freeze(x) for x in v)
    return v


def as_date(d: dt.date | str) -> dt.date:
    return d if isinstance(d, dt.date) else dt.date.fromisoformat(d)
