"""`vmmarena stat`: a snapshot (the JSON of vmm_arena_snapshot_json, docs/snapshot.md) shown
as tables.

render(doc) takes the parsed document (a dict: vmmarena.snapshot() returns one) and returns
the text; parse(text) reads JSON strictly. Both raise SnapshotError with a message naming the
key, or the line and column, of the first thing wrong.
"""

import json

SCHEMA = "vmmarena.snapshot"
VERSION = 4
# Version 2 called the idle tier "retained" in the kinds and "idle_unmapped" in the pool.
RENAMED_IN_3 = {"retained_count": "idle_count", "retained_bytes": "idle_bytes",
                "idle_unmapped_handles": "idle_handles", "idle_unmapped_bytes": "idle_bytes"}
# Version 3 called pool.ranges_handed_to_retiring "pooled_taken_apart_early".
RENAMED_IN_4 = {"pooled_taken_apart_early": "ranges_handed_to_retiring"}
KINDS = ("package", "transient")
STATES = ("live", "pooled", "freeing", "deferred", "abandoned", "paused")
TAG_WIDTH = 32
LARGEST_SHOWN = 10
BUCKETS_SHOWN = 16

_MISSING = object()


class SnapshotError(ValueError):
    """The input is not valid JSON or not a vmmarena snapshot of version 2, 3 or 4."""


def _reject_constant(name):
    raise _NotJSON(f"{name} is not a JSON value")


class _NotJSON(ValueError):
    """NaN or Infinity, which the json module reads and JSON does not have."""


class _RepeatedKey(ValueError):
    pass


def _no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _RepeatedKey(f'key "{_printable(key, 40)}" appears twice in one object')
        seen[key] = value
    return seen


def parse(text):
    """The document in `text` (str or bytes). Strict: no NaN or Infinity, no repeated key.
    Raises SnapshotError: "not JSON (line L column C: what)" for what is no JSON document,
    "not a vmmarena snapshot (...)" for a repeated key."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SnapshotError(f"not JSON (not UTF-8 at byte {e.start})") from None
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise SnapshotError(f"not JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    except _NotJSON as e:  # json gives no position for these
        raise SnapshotError(f"not JSON ({e})") from None
    except _RepeatedKey as e:
        raise SnapshotError(f"not a vmmarena snapshot ({e})") from None


def fmt_bytes(n):
    """1536 -> "1.5 KiB"; below 1 KiB in bytes ("512 B")."""
    if n < 1024:
        return f"{n} B"
    value, unit = n / 1024.0, 0
    units = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    while value >= 1024.0 and unit < len(units) - 1:
        value /= 1024.0
        unit += 1
    return f"{value:.1f} {units[unit]}"


def _type_name(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _article(name):
    return "an" if name[0] in "aeiou" else "a"


class _Doc:
    """Typed access to the document by path ("pool.hits", "mappings[3].state")."""

    def __init__(self, root):
        self.root = root

    def get(self, path, *types, default=_MISSING):
        node = self.root
        for part in path.replace("[", ".[").split("."):
            if part.startswith("["):
                index = int(part[1:-1])
                node = node[index] if isinstance(node, list) and index < len(node) else _MISSING
            else:
                node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
            if node is _MISSING:
                break
        if node is _MISSING:
            if default is not _MISSING:
                return default
            raise SnapshotError(f'snapshot key "{path}" is missing')
        if _type_name(node) not in types:
            wanted = " or ".join(f"{_article(t)} {t}" for t in types)
            shown = json.dumps(node)[:40]
            raise SnapshotError(
                f'snapshot key "{path}" is {_article(_type_name(node))} {_type_name(node)} ({shown}), expected {wanted}'
            )
        return node

    def u64(self, path, default=_MISSING):
        v = self.get(path, "number", default=default)
        if isinstance(v, float) or v < 0 or v >= 1 << 64:
            raise SnapshotError(f'snapshot key "{path}" is {v}, expected a non-negative integer')
        return v

    def text(self, path):
        return self.get(path, "string")

    def flag(self, path, default=_MISSING):
        return self.get(path, "boolean", default=default)


def _printable(s, width=None, pad=False):
    """s with control characters and backslashes escaped, cut to `width` with "..."."""
    cells = []
    for ch in s:
        code = ord(ch)
        if code < 0x20 or code == 0x7F:
            cells.append(f"\\x{code:02x}")
        elif 0x80 <= code < 0xA0:
            cells.append(f"\\u{code:04x}")
        elif ch == "\\":
            cells.append("\\\\")
        else:
            cells.append(ch)
    out = "".join(cells)
    if width is not None and len(out) > width:
        out = out[: width - 3] + "..."
    return out.ljust(width) if pad and width else out


def _tag(t, width=TAG_WIDTH, pad=True):
    return ("(no tag)".ljust(width) if pad else "(no tag)") if t is None else _printable(t, width, pad)


def _header(d, out):
    policy = d.text("reuse.policy")
    reuse = policy
    if policy == "bounded":
        bound = d.get("reuse.bound", "number", "null")
        if bound is not None:
            reuse = f"bounded:{bound:g}"
    refill = d.get("reuse.refill_share", "number", default=0)  # absent in snapshots before it existed
    refill_live = d.get("reuse.refill_live_share", "number", default=0)
    limit = d.u64("limit_bytes")
    gpu = "integrated (unified-memory)" if d.flag("integrated") else "discrete"
    out.append(f"vmmarena snapshot (schema version {d.u64('version')}): device {d.u64('device')}, {gpu} GPU")
    out.append(
        f"  retention {'on' if d.flag('retention.enabled') else 'off'} (mode {d.text('retention.mode')}); "
        f"reuse {reuse}; handle bound {fmt_bytes(d.u64('reuse.handle_bound_bytes'))}; package assembly "
        f"{'on' if d.flag('reuse.package_assembly') else 'off'}; granularity {fmt_bytes(d.u64('granularity'))}"
        + (f"; refill below-peak:{refill:g}" if refill else "")
        + (f"; refill within-live:{refill_live:g}" if refill_live else "")
    )
    out.append(f"  headroom {fmt_bytes(d.u64('headroom_bytes'))}; limit {fmt_bytes(limit) if limit else 'none'}")


def _totals(d, out):
    n = d.u64("totals.reservations")
    out.append("")
    out.append("Totals              current         peak")
    out.append(f"  physical     {fmt_bytes(d.u64('totals.physical_bytes')):>12} {fmt_bytes(d.u64('totals.physical_peak_bytes')):>12}")
    out.append(f"  mapped       {fmt_bytes(d.u64('totals.mapped_bytes')):>12} {fmt_bytes(d.u64('totals.mapped_peak_bytes')):>12}")
    out.append(f"  reserved VA  {fmt_bytes(d.u64('totals.reserved_va_bytes')):>12} in {n} reservation{'' if n == 1 else 's'}")
    out.append(
        f"  operations   {d.u64('totals.allocs')} allocs, {d.u64('totals.frees')} frees, "
        f"{d.u64('totals.deferred_frees')} deferred frees"
    )


def _kinds(d, out):
    columns = ("live", "pooled", "idle", "abandoned", "paused")
    out.append("")
    out.append(f"{'By kind':<12}  {'live':<17}  {'pooled':<17}  {'idle':<17}  {'abandoned':<17}  paused")
    for kind in KINDS:
        cells = []
        for c in columns:
            count = d.u64(f"kinds.{kind}.{c}_count")
            cells.append(f"{count} / {fmt_bytes(d.u64(f'kinds.{kind}.{c}_bytes'))}")
        out.append(f"  {kind:<10}  {cells[0]:<17}  {cells[1]:<17}  {cells[2]:<17}  {cells[3]:<17}  {cells[4]}")


def _pool(d, out):
    hits, misses = d.u64("pool.hits"), d.u64("pool.misses")
    buckets = d.get("pool.buckets", "array")
    rate = f"{100.0 * hits / (hits + misses):.1f}%" if hits + misses else "n/a"
    out.append("")
    out.append("Idle handles")
    out.append(
        f"  reusable  {d.u64('pool.retained_reusable_handles')} handles ({fmt_bytes(d.u64('pool.retained_reusable_bytes'))}): "
        f"{d.u64('pool.idle_handles')} idle ({fmt_bytes(d.u64('pool.idle_bytes'))}), the rest "
        f"in pooled mappings in {len(buckets)} bucket{'' if len(buckets) == 1 else 's'}"
    )
    out.append(
        f"  hits {hits}, misses {misses}, hit rate {rate}, fallbacks {d.u64('pool.fallbacks')}, "
        f"assemblies {d.u64('pool.assemblies')} ({d.u64('pool.padded_assemblies')} padded, "
        f"{d.u64('pool.assembled_idle_handles')} idle handles, {fmt_bytes(d.u64('pool.assembly_created_bytes'))} "
        f"created, {d.u64('pool.pooled_taken_apart')} pooled mappings taken apart)"
    )
    handed = d.u64("pool.ranges_handed_to_retiring", default=0)  # whole-process mode; absent in old snapshots
    if handed:
        out.append(
            f"  retired   {handed} ranges handed to the retiring list, {d.u64('pool.retiring_ranges')} on it now "
            f"({fmt_bytes(d.u64('pool.retiring_bytes'))})"
        )
    for i in range(len(buckets)):
        size, count = d.u64(f"pool.buckets[{i}].size"), d.u64(f"pool.buckets[{i}].count")
        if i < BUCKETS_SHOWN:
            out.append(f"  bucket {fmt_bytes(size):>12} x {count}")
    if len(buckets) > BUCKETS_SHOWN:
        out.append(f"  ... {len(buckets) - BUCKETS_SHOWN} more buckets")


def _refusals_and_scope(d, out):
    out.append("")
    out.append("Refusals")
    out.append(
        f"  out of memory {d.u64('refusals.out_of_memory')}, limit {d.u64('refusals.limit')}, "
        f"headroom {d.u64('refusals.headroom')}"
    )
    state = d.text("scope.state")
    if state == "active":
        state = f"active (id {d.u64('scope.id')})"
    elif state != "none":
        raise SnapshotError(f'snapshot key "scope.state" has an unknown value "{state[:40]}"')
    out.append("")
    out.append("Retention scope")
    out.append(
        f"  {state}; begun {d.u64('scope.begun')}, finished {d.u64('scope.finished')}, "
        f"aborted {d.u64('scope.aborted')}"
    )


def _tags(d, out):
    rows = []
    for i in range(len(d.get("tags", "array"))):
        rows.append((d.get(f"tags[{i}].tag", "string", "null"), d.u64(f"tags[{i}].count"), d.u64(f"tags[{i}].bytes"),
                     d.u64(f"tags[{i}].paused_count"), d.u64(f"tags[{i}].paused_bytes")))
    # largest first; then more allocations; named tags before "no tag"; then by name
    rows.sort(key=lambda r: (-r[2], -r[1], r[0] is None, r[0] or ""))
    out.append("")
    out.append("Tags (live bytes, largest first)")
    if not rows:
        out.append("  none")
    for tag, count, size, paused_count, paused in rows:
        line = f"  {_tag(tag)} {fmt_bytes(size):>12}  {count} allocation{'' if count == 1 else 's'}"
        if paused_count:
            line += f", {paused_count} paused ({fmt_bytes(paused)})"
        out.append(line)


def _driver(d, out):
    rows = []
    for name in d.get("driver", "object"):
        if "." in name or "[" in name:
            raise SnapshotError(f'snapshot key "driver" holds an entry named "{name[:40]}", not a driver entry point')
        rows.append((name, d.u64(f"driver.{name}.calls"), d.u64(f"driver.{name}.failures"), d.u64(f"driver.{name}.ns")))
    rows.sort(key=lambda r: (-r[3], r[0]))
    out.append("")
    out.append(f"{'Driver calls (by total time)':<32} {'calls':>10} {'failures':>10} {'total ms':>12} {'mean us':>10}")
    for name, calls, failures, ns in rows:
        mean = ns / 1e3 / calls if calls else 0.0
        out.append(f"  {name:<30} {calls:>10} {failures:>10} {ns / 1e6:>12.3f} {mean:>10.2f}")
    total = [sum(r[i] for r in rows) for i in (1, 2, 3)]
    out.append(f"  {'all':<30} {total[0]:>10} {total[1]:>10} {total[2] / 1e6:>12.3f}")


def _errors(d, out):
    fatal = d.get("fatal_error", "object", "null")
    out.append("")
    out.append("Fatal error")
    if fatal is None:
        out.append("  none")
    else:
        out.append(f"  {d.text('fatal_error.status')}: {_printable(d.text('fatal_error.message'))}")
    last = d.text("last_error")
    out.append("")
    out.append("Last error")
    out.append(f"  {_printable(last) if last else 'none'}")


def _inventory(d, out):
    rows = []
    for i in range(len(d.get("mappings", "array"))):
        p = f"mappings[{i}]"
        kind, state = d.text(f"{p}.kind"), d.text(f"{p}.state")
        for value, names, key in ((kind, KINDS, "kind"), (state, STATES, "state")):
            if value not in names:
                raise SnapshotError(f'snapshot key "{p}.{key}" has an unknown value "{value[:40]}"')
        base = d.text(f"{p}.base")
        rows.append(
            {
                "base": base,
                "extent": d.u64(f"{p}.extent"),
                "requested": d.u64(f"{p}.requested"),
                "kind": kind,
                "state": state,
                "handles": d.u64(f"{p}.handles"),
                "scope": d.u64(f"{p}.scope"),
                "tag": d.get(f"{p}.tag", "string", "null"),
            }
        )
    total = sum(r["extent"] for r in rows)
    out.append("")
    out.append(f"Inventory: {len(rows)} mapping{'' if len(rows) == 1 else 's'}, {fmt_bytes(total)}")
    for kind in KINDS:
        for state in STATES:
            group = [r["extent"] for r in rows if r["kind"] == kind and r["state"] == state]
            if group:
                out.append(f"  {kind:<10} {state:<10} {len(group):>8} {fmt_bytes(sum(group)):>12}")
    rows.sort(key=lambda r: (-r["extent"], r["base"]))
    shown = rows[:LARGEST_SHOWN]
    if shown:
        out.append(f"  Largest {len(shown)}:")
        out.append(f"  {'base':<18} {'extent':>12} {'requested':>12}  {'kind':<10} {'state':<10} {'handles':>7} {'scope':>6}  tag")
        for r in shown:
            out.append(
                f"  {_printable(r['base'], 18, True)} {fmt_bytes(r['extent']):>12} {fmt_bytes(r['requested']):>12}  "
                f"{r['kind']:<10} {r['state']:<10} {r['handles']:>7} {r['scope']:>6}  {_tag(r['tag'], pad=False)}"
            )


def _renamed(doc, version):
    """A document of version 2 or 3 with the names of the current version."""
    out = dict(doc)
    if version == 2:
        for section in ("kinds", "pool"):
            if isinstance(doc.get(section), dict):
                out[section] = {RENAMED_IN_3.get(k, k): v for k, v in doc[section].items()}
        if isinstance(out.get("kinds"), dict):
            out["kinds"] = {kind: {RENAMED_IN_3.get(k, k): v for k, v in stats.items()} if isinstance(stats, dict)
                            else stats for kind, stats in out["kinds"].items()}
    if isinstance(out.get("pool"), dict):
        out["pool"] = {RENAMED_IN_4.get(k, k): v for k, v in out["pool"].items()}
    return out


def render(doc):
    """The tables for a parsed snapshot, as one string ending in a newline."""
    if not isinstance(doc, dict):
        raise SnapshotError(f"not a vmmarena snapshot (the document is {_article(_type_name(doc))} {_type_name(doc)}, "
                            "not an object)")
    if "schema" not in doc:
        raise SnapshotError('not a vmmarena snapshot (no "schema" key)')
    schema = doc["schema"]
    if not isinstance(schema, str):
        raise SnapshotError(f'not a vmmarena snapshot ("schema" is {_article(_type_name(schema))} '
                            f'{_type_name(schema)}, expected "{SCHEMA}")')
    if schema != SCHEMA:
        raise SnapshotError(f'not a vmmarena snapshot ("schema" is "{_printable(schema, 40)}", expected "{SCHEMA}")')
    d = _Doc(doc)
    version = d.u64("version")
    if version not in (2, 3, VERSION):
        raise SnapshotError(f"snapshot version {version} is not supported (this tool reads versions 2 to {VERSION})")
    if version < VERSION:
        d = _Doc(_renamed(doc, version))
    out = []
    for section in (_header, _totals, _kinds, _pool, _refusals_and_scope, _tags, _driver, _errors, _inventory):
        section(d, out)
    return "\n".join(out) + "\n"
