"""What bench-step's JSON holds, checked and printed, without MLX (render reads it on any machine): the
schema, the decode and prefill measures' keys, `check_result` and `format_table`."""

import math

from pdlib.errors import INT64_MAX, InputError

SCHEMA = "pdlib.bench-step/1"
DECODES = {"observed": "decode_ms_median", "pipelined": "decode_pipelined_ms_median"}  # transformers': observed
# two requests decoded in one launch (pdlib alone, where it pairs decodes): per step of two tokens
PAIRS = {"pair_step_ms_median": "pair step ms", "pair_step_pipelined_ms_median": "pair pipelined ms"}
PREFILLS = {
    "prefill_whole_s": "whole prompt",
    "prefill_chunked_s": "{chunk}-token chunks",
    "prefill_chunked_synced_s": "{chunk}-token chunks, each synced",
}  # formatted with the run's chunk


def check_result(result, *, where: str) -> dict:
    """A bench-step JSON as render reads it: InputError, one line, naming the first field its table and charts
    could not use."""
    if not isinstance(result, dict) or result.get("schema") != SCHEMA:
        raise InputError(f"{where}: not a bench-step result (schema {SCHEMA!r})")
    engines, floors = result.get("engines"), result.get("floors")
    if not isinstance(engines, dict) or "pdlib" not in engines or not isinstance(floors, dict) or not floors:
        raise InputError(f"{where}: a bench-step result needs engines (pdlib among them) and floors")
    for key in ("settings", "environment"):  # optional, but read as objects where present
        if key in result and not isinstance(result[key], dict):
            raise InputError(f"{where}: {key} is {result[key]!r:.60}; expected an object")
    for ctx, f in floors.items():
        if not (ctx.isdigit() and int(ctx) > 0) or not isinstance(f, dict):
            raise InputError(f"{where}: floors[{ctx!r}] is {f!r:.60}; expected a positive context mapped to an object")
        if not (_positive(f.get("bytes")) and _positive(f.get("floor_ms"))):
            raise InputError(
                f"{where}: floors[{ctx!r}] needs bytes and floor_ms, positive finite numbers; got {f!r:.80}"
            )
    for name, e in engines.items():
        _check_engine(name, e, set(floors), where)
    if result.get("rounds") is not None:
        _check_rounds(result["rounds"], where)
    return result


def _check_engine(name: str, e, contexts: set, where: str) -> None:
    """One engine's medians: decode (observed, pipelined where timed) at every context, pairs at some, prefills
    as positive numbers. A peer that failed carries only its error; pdlib, which every ratio divides by, may not."""
    if not isinstance(e, dict) or (name == "pdlib" and "error" in e):
        want = "an object of its medians" + ("" if name == "pdlib" else ' (or {"error": ...})')
        raise InputError(f"{where}: engine {name!r} is {e!r:.60}; expected {want}")
    if "error" in e:
        return
    at = ", ".join(sorted(contexts, key=int))
    for key in DECODES.values():
        table = e.get(key)
        if key == DECODES["observed"] or table is not None:
            ok = isinstance(table, dict) and set(table) == contexts
            if not ok or not all(_positive(v) for v in table.values()):
                raise InputError(f"{where}: engine {name!r} lacks {key} at contexts {at} (positive numbers of ms)")
    for key in PAIRS:
        table = e.get(key)
        if table is not None and not (
            isinstance(table, dict) and set(table) <= contexts and all(_positive(v) for v in table.values())
        ):
            raise InputError(f"{where}: engine {name!r} {key} needs positive numbers of ms at contexts among {at}")
    for key in PREFILLS:
        if key in e and not _positive(e[key]):
            raise InputError(f"{where}: engine {name!r} {key} is {e[key]!r:.60}; expected a positive number of s")


def _check_rounds(r, where: str) -> None:
    """A result's decode rounds: every mode's medians (and pipelined ones, where timed) and a floor at each row
    count, as numbers."""
    rows = r.get("rows") if isinstance(r, dict) else None
    whole = isinstance(rows, list) and rows and all(isinstance(n, int) and _positive(n) for n in rows)
    if not whole or not _positive(r.get("context")) or not isinstance(r.get("ms"), dict) or not r["ms"]:
        raise InputError(f"{where}: rounds need a context, rows (request counts), ms per mode and floor_ms per row")
    keys = {str(n) for n in rows}
    for extra in ("pipelined_ms", "host_ms"):  # optional: per mode, where timed so
        if not isinstance(r.get(extra) or {}, dict):
            raise InputError(f"{where}: rounds {extra} is {r[extra]!r:.60}; expected an object of modes")
    piped, host = r.get("pipelined_ms") or {}, r.get("host_ms") or {}
    tables = {"floor_ms": r.get("floor_ms")}
    tables |= {f"ms[{m!r}]": v for m, v in r["ms"].items()}
    tables |= {f"pipelined_ms[{m!r}]": v for m, v in piped.items()}
    # the table prints the host's part beside every pipelined mode's round
    tables |= {f"host_ms[{m!r}]": host.get(m) for m in dict.fromkeys([*piped, *host])}
    at = ", ".join(sorted(keys, key=int))
    for name, table in tables.items():
        ok = isinstance(table, dict) and keys <= set(table)
        if name.startswith("host_ms"):
            if not ok or not all(_positive(table[k]) or _zero(table[k]) for k in keys):
                raise InputError(f"{where}: rounds {name} needs a number >= 0 at rows {at}")
        elif not ok or not all(_positive(table[k]) for k in keys):
            raise InputError(f"{where}: rounds {name} needs a positive number at rows {at}")


def _zero(x) -> bool:
    return type(x) in (int, float) and x == 0


def _positive(x) -> bool:
    """A positive finite number; an integer within int64 (the charts' JSON reader takes no larger)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return False
    return 0 < x <= INT64_MAX if isinstance(x, int) else 0 < x < math.inf


def format_table(result: dict) -> str:
    """Medians per engine; for decode, pdlib's bandwidth and the byte floor; ratios are each peer over pdlib."""
    e, floors = result["engines"], result["floors"]
    peers = [n for n in e if n != "pdlib" and "error" not in e[n]]
    head = f"{'what':26s} {'pdlib':>10s} " + " ".join(f"{n:>10s} {'ratio':>6s}" for n in peers)
    lines = [head + f" {'pdlib GB/s':>11s} {'floor':>9s}"]

    def row(label, key, sub=None):  # a peer without the measure shows dashes
        get = (lambda n: e[n][key][sub]) if sub else (lambda n: e[n][key])
        p = get("pdlib")
        return f"{label:26s} {p:10.4g} " + " ".join(
            f"{get(n):10.4g} {get(n) / p:5.1f}x" if key in e[n] else f"{'-':>10s} {'-':>6s}" for n in peers
        )

    for how, key in DECODES.items():
        if key not in e["pdlib"]:
            continue
        label = "decode ms" if how == "observed" else f"decode {how} ms"
        for ctx, f in floors.items():
            p = e["pdlib"][key][ctx]
            lines.append(row(f"{label} @ {ctx}", key, ctx) + f" {f['bytes'] / p / 1e6:11.0f} {f['floor_ms']:8.3f}ms")
    for key, how in PAIRS.items():  # pdlib's alone: two requests' decodes in one launch, per step of two tokens
        for ctx in floors:
            if ctx in e["pdlib"].get(key, {}):
                lines.append(row(f"{how} @ {ctx}", key, ctx) + f"  ({e['pdlib'][key][ctx] / 2:.4g} ms a token)")
    for key in PREFILLS:
        if all(key in e[n] for n in e):
            lines.append(row(key.replace("_s", " s").replace("prefill_", "prefill "), key))
    r = result.get("rounds")
    for n in r["rows"] if r else ():  # pdlib's alone: a step of n decodes, each mode, against its byte floor
        floor = r["floor_ms"][str(n)]
        host, piped = r.get("host_ms", {}), r.get("pipelined_ms", {})

        def cell(m: str, ms: float) -> str:  # observed; pipelined against the floor, and the host's part
            if m not in piped:
                return f"{m} {ms:.4g} ms ({ms / floor:.1f}x" + (f", host {host[m][str(n)]:.3g})" if m in host else ")")
            p = piped[m][str(n)]
            return f"{m} {ms:.4g} / pipelined {p:.4g} ms ({p / floor:.1f}x, host {host[m][str(n)]:.3g})"

        cells = "  ".join(cell(m, v[str(n)]) for m, v in r["ms"].items())
        lines.append(f"{'round of ' + str(n) + ' @ ' + str(r['context']):26s} {cells}  floor {floor:.3f} ms")
    return "\n".join(lines)
