"""Sampling the length, turn-count and think-time distributions of a profile.

Every sampler draws a whole array from a numpy Generator at once; the planner calls them per
block of requests, so one request costs well under a microsecond. Values outside [min, max] are
clipped (set to the bound), not redrawn. Integer units (tokens, turns) are rounded to the nearest
integer after clipping to real bounds, then clipped again so the bounds hold exactly.

Formulas (x is the drawn value before clipping):
- fixed:     x = value
- uniform:   integers min..max inclusive (tokens, turns), or a real in [min, max) (seconds)
- normal:    x ~ Normal(mean, stdev)
- lognormal: ln x ~ Normal(mu, sigma), mu = ln(median), or mu = ln(mean) - sigma^2 / 2
- empirical: one of the samples with equal probability; or a histogram bin chosen with
             probability weight / sum(weights) and a uniform value inside it
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Callable

import numpy as np

from servelab.core import jsonlines
from servelab.profiles import files
from servelab.profiles.limits import MAX_DURATION_S, MAX_TOKENS

Sampler = Callable[[np.random.Generator, "int | tuple[int, ...]"], np.ndarray]


def make_sampler(dist, *, integer: bool = True, low: float | None = None,
                 high: float | None = None) -> Sampler:
    """A function (rng, size) -> array for one distribution of the schema.

    ``low`` is the floor applied when the distribution names no ``min`` (1 for tokens and turns,
    0 for seconds); ``high`` the ceiling when it names no ``max`` (the profile limits: a lognormal
    tail may not overflow the integer cast).
    """
    if low is None:
        low = 1.0 if integer else 0.0
    if high is None:
        high = float(MAX_TOKENS) if integer else MAX_DURATION_S
    kind = dist.kind
    if kind == "fixed":
        value = float(dist.value)
        return _finish(lambda rng, size: np.full(size, value), low, high, integer)
    if kind == "uniform":
        lo, hi = float(dist.min), float(dist.max)
        if integer:
            return lambda rng, size: rng.integers(int(lo), int(hi) + 1, size=size)
        return lambda rng, size: rng.uniform(lo, hi, size=size)
    if kind == "normal":
        lo = low if dist.min is None else float(dist.min)
        hi = high if dist.max is None else float(dist.max)
        # abs(): numpy refuses a stdev or sigma of -0.0, which the schema's ">= 0" lets through.
        mean, stdev = float(dist.mean), abs(float(dist.stdev))
        return _finish(lambda rng, size: rng.normal(mean, stdev, size=size), lo, hi, integer)
    if kind == "lognormal":
        lo = low if dist.min is None else float(dist.min)
        hi = high if dist.max is None else float(dist.max)
        mu, sigma = lognormal_mu(dist), abs(float(dist.sigma))
        return _finish(lambda rng, size: rng.lognormal(mu, sigma, size=size), lo, hi, integer)
    if kind == "empirical":
        if dist.histogram is not None:
            return _histogram_sampler(dist.histogram, integer)
        values = np.asarray(dist.samples if dist.samples is not None else dist._values, float)
        return lambda rng, size: _cast(values[rng.integers(0, len(values), size=size)], integer)
    raise ValueError(f"unknown distribution kind {kind!r}")


def lognormal_mu(dist) -> float:
    if dist.median is not None:
        return math.log(dist.median)
    return math.log(dist.mean) - dist.sigma ** 2 / 2


def _finish(draw, lo: float, hi: float, integer: bool) -> Sampler:
    def sample(rng, size):
        x = np.clip(draw(rng, size), lo, hi)
        return _cast(np.clip(np.rint(x), math.ceil(lo), hi), True) if integer else x
    return sample


def _cast(x: np.ndarray, integer: bool) -> np.ndarray:
    return x.astype(np.int64) if integer else x.astype(float)


def _histogram_sampler(bins, integer: bool) -> Sampler:
    weights = np.abs(np.array([b.weight for b in bins], float))
    p = weights / weights.sum()
    lo = np.array([b.min for b in bins], float)
    hi = np.array([b.max for b in bins], float)

    def sample(rng, size):
        which = rng.choice(len(bins), size=size, p=p)
        if integer:
            return rng.integers(lo[which].astype(np.int64), hi[which].astype(np.int64) + 1)
        return rng.uniform(lo[which], hi[which])
    return sample


def describe(dist, unit: str = "") -> str:
    """One line for `profiles show`: the distribution and its parameters."""
    u = f" {unit}" if unit else ""
    kind = dist.kind
    if kind == "fixed":
        return f"fixed {dist.value:g}{u}"
    if kind == "uniform":
        return f"uniform {dist.min:g}..{dist.max:g}{u}"
    clip = ""
    if kind in ("normal", "lognormal") and (dist.min is not None or dist.max is not None):
        lo = "" if dist.min is None else f"{dist.min:g}"
        hi = "" if dist.max is None else f"{dist.max:g}"
        clip = f", clipped to [{lo}, {hi}]"
    if kind == "normal":
        return f"normal mean {dist.mean:g} stdev {dist.stdev:g}{clip}"
    if kind == "lognormal":
        centre = f"median {dist.median:g}" if dist.median is not None else f"mean {dist.mean:g}"
        return f"lognormal {centre} sigma {dist.sigma:g}{clip}"
    if dist.samples is not None:
        return f"empirical, {len(dist.samples)} samples"
    if dist.histogram is not None:
        return f"empirical histogram, {len(dist.histogram)} bins"
    return f"empirical from {dist.file} ({len(dist._values)} values)"


def read_values_file(path: Path, column: str | None = None) -> list[float]:
    """Numbers from a CSV (optional header; pick ``column``) or JSONL (numbers or objects) file.

    Raises ValueError naming the file's line when a value is missing or not a number, OSError
    when the file cannot be read or is not a regular file under the size cap.
    """
    path = Path(path)
    text = files.read_text(path)
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        return _read_jsonl(text, column)
    try:
        return _read_csv(text, column)
    except csv.Error as exc:   # a field over csv's size limit, a NUL byte
        raise ValueError(f"not CSV ({exc})") from None


def _number(cell, where: str) -> float:
    try:
        value = float(cell)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{where}: {cell!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{where}: {cell!r} is not a finite number")
    return value


def _read_csv(text: str, column: str | None) -> list[float]:
    rows = [(n, r) for n, r in enumerate(csv.reader(text.splitlines()), start=1)
            if r and not r[0].lstrip().startswith("#")]
    if not rows:
        raise ValueError("no rows")
    first_line, first = rows[0]
    try:
        [float(c) for c in first]
        header = None
    except ValueError:
        header = [c.strip() for c in first]
        rows = rows[1:]
    if header is None:
        if column is not None:
            raise ValueError(f"column {column!r} given but the file has no header row")
        if len(first) != 1:
            raise ValueError(f"line {first_line}: {len(first)} columns and no header; "
                             "add a header row and name the column")
        index = 0
    elif column is None:
        if len(header) != 1:
            raise ValueError(f"columns {', '.join(header)}: name one with 'column'")
        index = 0
    elif column in header:
        index = header.index(column)
    else:
        raise ValueError(f"no column {column!r} (columns: {', '.join(header)})")
    values = []
    for n, row in rows:
        if index >= len(row):
            raise ValueError(f"line {n}: missing column {index + 1}")
        values.append(_number(row[index].strip(), f"line {n}"))
    if not values:
        raise ValueError("no values")
    return values


def _read_jsonl(text: str, column: str | None) -> list[float]:
    values = []
    for n, item in jsonlines.numbered(text):
        if isinstance(item, dict):
            if column is None:
                raise ValueError(f"line {n}: an object; name its length field with 'column'")
            if column not in item:
                raise ValueError(f"line {n}: no field {column!r}")
            item = item[column]
        values.append(_number(item, f"line {n}"))
    if not values:
        raise ValueError("no values")
    return values
