"""The kv-rotation feature's checks (docs/rotation.md, "What a correct port must show").

Quality is measured the way llama-perplexity measures it (the harness does it through
llama.h: chunks of 512, 8 of them, the first half of each unscored), against one base: the
f16-cache logits of upstream's own rotation build (the live reference), so that the port and
upstream are held to the same yardstick even where the tree's own f16 numerics moved.

  a  rotation off is a no-op: an f16 cache, and the quantized caches with
     LLAMA_ATTN_ROT_DISABLE=1, give logits bit-identical to the unpatched build (every scored
     token of the runs);
  b  rotation on: KLD and top-1 equal upstream's own rotation; how far the tree's own f16 run
     is from upstream's is reported apart, and a tree whose own numerics differ from
     upstream's is said to, not failed for it;
  c  the log says attn_rot_k / attn_rot_v as the cache configuration predicts;
  d  context shift: a shifted rotated cache behaves like one filled fresh at the shifted
     positions, as well as the unpatched tree's does; a port without the un-rotate/re-rotate
     steps (the deliberately broken templates) fails the same check;
  e  saved state: the rotation is not recorded in a saved session; what loading it with the
     other setting gives is measured and pinned down.
"""

from __future__ import annotations

from typing import Any

from portkit.models import FULL_MODEL, QUICK_MODEL
from portkit.validate import (
    AS_UPSTREAM,
    BROKEN,
    DOCUMENTED,
    FAIL,
    OWN_NUMERICS,
    PASS,
    PATCHED,
    UNPATCHED,
    UPSTREAM,
    Check,
    Context,
    Quality,
    Runner,
)

QUICK_CONFIGS = ("q8_0/q8_0", "q4_0/q4_0")
FULL_CONFIGS = ("q8_0/q8_0", "q8_0/q4_0", "f16/q4_0", "q4_0/q4_0")
F16 = "f16/f16"
KLD_TOLERANCE = 0.01  # relative, against upstream's figure
SHIFT_FACTOR, SHIFT_SLACK = 1.5, 0.005  # patched shift KLD <= factor * unpatched + slack
DISABLED = " LLAMA_ATTN_ROT_DISABLE=1"


def run(ctx: Context) -> tuple[list[str], list[Check]]:
    chosen = ctx.models or ([QUICK_MODEL, FULL_MODEL] if ctx.full else [QUICK_MODEL])
    checks: list[Check] = []
    for model in chosen:
        configs: tuple[str, ...] = FULL_CONFIGS if ctx.full else QUICK_CONFIGS
        table = ctx.published.get(model, {})
        if not ctx.live and table:
            configs = tuple(c for c in configs if c in table) or configs
        base = UPSTREAM if ctx.live else UNPATCHED  # whose f16-cache logits are the base
        checks.append(check_noop(ctx.runner, model, configs, base))
        checks += check_quality(ctx, model, configs, table, base)
        checks.append(check_shift(ctx, model, ("q8_0/q8_0", "q4_0/q4_0") if ctx.full
                                  else ("q8_0/q8_0",)))
        checks.append(check_state(ctx.runner, model))
    return chosen, checks


def check_noop(r: Runner, model: str, configs: tuple[str, ...], base: str) -> Check:
    figures: dict[str, Any] = {}
    same = True
    for config, disable in ((F16, False), *((c, True) for c in configs)):
        off = r.quality(UNPATCHED, model, config, base=base)
        patched = r.quality(PATCHED, model, config, disable=disable, base=base)
        equal = bool(off.digest) and off.digest == patched.digest
        figures[config + (DISABLED if disable else "")] = "bit-identical" if equal else "DIFFERENT"
        same = same and equal
    shape = r.quality(PATCHED, model, F16, base=base)
    figures["logits compared"] = (f"all {shape.tokens} scored tokens x {shape.vocab} "
                                  f"(float32) of each run")
    return Check("a", f"rotation off is a no-op ({model})", PASS if same else FAIL, figures)


def _expect(config: str, disable: bool) -> tuple[int, int]:
    ctk, ctv = config.split("/")
    return int(not disable and ctk != "f16"), int(not disable and ctv != "f16")


def _pair(q: Quality) -> tuple[float, float]:
    return q.kld, q.top1


def _fig(q: Quality) -> str:
    return f"{q.kld:.6f} / {q.top1:.3f}%"


def _relative(a: float, b: float) -> float | None:
    return abs(a - b) / b if b else None


def check_quality(ctx: Context, model: str, configs: tuple[str, ...], table: dict[str, Any],
                  base: str) -> tuple[Check, Check]:
    r = ctx.runner
    figures: dict[str, Any] = {}
    flags: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    verdicts: list[str] = []
    flags_ok = True
    upstream_f16 = r.base(base, model)
    own = r.quality(UNPATCHED, model, F16, base=base)
    patched_f16 = r.quality(PATCHED, model, F16, base=base)
    if ctx.live:
        identical = own.digest == upstream_f16.get("digest")
        figures["the tree's own f16 run vs upstream's"] = (
            f"KLD {own.kld:.6f}, top-1 {own.top1:.3f}%, "
            + ("bit-identical logits" if identical else "the tree's own numerics differ"))
        rows.append({"model": model, "config": F16, "off": _pair(own), "disabled": None,
                     "on": _pair(patched_f16), "upstream off": None, "upstream on": None})
    for config in configs:
        off = r.quality(UNPATCHED, model, config, base=base)
        dis = r.quality(PATCHED, model, config, disable=True, base=base)
        on = r.quality(PATCHED, model, config, base=base)
        published = table.get(config, {}).get("on")
        up_on = up_off = None
        if ctx.live:
            up_on = r.quality(UPSTREAM, model, config, base=base)
            up_off = r.quality(UPSTREAM, model, config, disable=True, base=base)
            ref_kld: float | None = up_on.kld
            source = f"{ctx.reference}, same run"
        elif published:
            ref_kld, source = published["kld"], "upstream's published figure"
        else:
            ref_kld, source = None, "no reference"
        rel = _relative(on.kld, ref_kld) if ref_kld is not None else None
        same_off = bool(off.digest) and dis.digest == off.digest
        text = (f"off {_fig(off)}, disabled {_fig(dis)}"
                + (" (bit-identical to off)" if same_off else " (DIFFERS from off)")
                + f", on {_fig(on)}; upstream on "
                + (f"{_fig(up_on)}, off {_fig(up_off)}" if up_on and up_off
                   else f"{ref_kld} / {published['top1']}%" if published else "-")
                + f" ({source})")
        if rel is not None:
            text += "; on equals upstream's" if rel == 0 else f"; KLD differs by {rel:.2%}"
        verdict = PASS if rel is not None and rel <= KLD_TOLERANCE and same_off else FAIL
        if verdict == FAIL and up_off is not None and same_off and on.kld < off.kld:
            moved = _relative(off.kld, up_off.kld)
            if off.digest != up_off.digest and moved is not None and moved > KLD_TOLERANCE:
                verdict = OWN_NUMERICS
                text += (f"; the tree's own rotation-off figure is {moved:.2%} from upstream's: "
                         f"its numerics differ, the port's cannot land on upstream's")
        verdicts.append(verdict)
        if published and ctx.live:
            text += f"; published (docs/fixtures.md): {published['kld']} / {published['top1']}%"
        figures[config] = text
        rows.append({"model": model, "config": config, "off": _pair(off),
                     "disabled": _pair(dis), "on": _pair(on),
                     "upstream off": _pair(up_off) if up_off else None,
                     "upstream on": _pair(up_on) if up_on else None})
        for label, res, disable in (("on", on, False), ("disabled", dis, True)):
            want = _expect(config, disable)
            got = (res.rot_k, res.rot_v)
            flags[f"{config} {label}"] = f"attn_rot_k = {got[0]}, attn_rot_v = {got[1]}"
            flags_ok = flags_ok and got == want
    flags["f16/f16 on"] = f"attn_rot_k = {patched_f16.rot_k}, attn_rot_v = {patched_f16.rot_v}"
    flags_ok = flags_ok and (patched_f16.rot_k, patched_f16.rot_v) == (0, 0)
    verdict = FAIL if FAIL in verdicts else OWN_NUMERICS if OWN_NUMERICS in verdicts else PASS
    yardstick = ("upstream's f16-cache logits (one base for the port and upstream)" if ctx.live
                 else "the unpatched tree's f16-cache logits")
    return (Check("b", f"rotation on equals upstream's (KLD, top-1; {model})", verdict, figures,
                  f"KLD and top-1 against {yardstick}, llama-perplexity's chunking (512 x 8, "
                  f"first half unscored); tolerance {KLD_TOLERANCE:.0%} relative KLD; "
                  f"'disabled' must be bit-identical to 'off'. Where the tree's own rotation-off "
                  f"figures are not upstream's (its own numerics moved, e.g. through a fork's "
                  f"own patches), the verdict is '{OWN_NUMERICS}' as long as the rotation "
                  f"improves them, not a failure", rows),
            Check("c", f"log lines report the rotation as configured ({model})",
                  PASS if flags_ok else FAIL, flags))


def check_shift(ctx: Context, model: str, configs: tuple[str, ...]) -> Check:
    """Pass: the port's shift is as good as the unpatched tree's and the broken port is
    caught. Where the port fails but upstream's own rotation fails identically, the verdict
    is "as upstream": the port is faithful, and the weakness is upstream's."""
    r = ctx.runner
    figures: dict[str, Any] = {}
    verdict = PASS
    for config in configs:
        res = {v: r.harness(v, model, "shift", config) for v in (UNPATCHED, PATCHED, BROKEN)}
        limit = SHIFT_FACTOR * res[UNPATCHED]["shift.kld"] + SHIFT_SLACK
        good = res[PATCHED]["shift.kld"] <= limit
        caught = res[BROKEN]["shift.kld"] > limit
        upstream = r.harness(UPSTREAM, model, "shift", config) if ctx.live else None
        same = upstream is not None and upstream["shift.kld"] == res[PATCHED]["shift.kld"]
        as_broken = res[PATCHED].values == res[BROKEN].values
        text = ", ".join(f"{v} KLD {res[v]['shift.kld']:.6f} top-1 {res[v]['shift.top1']:.1f}%"
                         for v in res)
        if upstream is not None:
            text += f", upstream KLD {upstream['shift.kld']:.6f}"
        text += (f"; limit {limit:.6f}: patched {'passes' if good else 'FAILS'}"
                 + ("" if good or not same else " exactly as upstream's own rotation does")
                 + (" (the port behaves exactly like the deliberately broken one)"
                    if not good and as_broken else "")
                 + f", broken port {'fails as it must' if caught else 'PASSES (check too weak)'}")
        figures[config] = text
        if not caught or (not good and not same):
            verdict = FAIL
        elif not good and verdict == PASS:
            verdict = AS_UPSTREAM
    return Check("d", f"context shift of a rotated quantized K cache ({model})", verdict,
                 figures, "shifted cache vs the same tokens computed fresh at the shifted "
                 "positions; the broken port lacks the un-rotate/re-rotate steps of the shift")


def check_state(r: Runner, model: str) -> Check:
    res = r.harness(PATCHED, model, "state", "q8_0/q8_0")
    same = res["state_on_on.kld"] == 0.0
    garbage = res["state_off_on.kld"] > 1.0 and res["state_on_off.kld"] > 1.0
    figures = {case: f"KLD {res[f'{case}.kld']:.6f}, top-1 {res[f'{case}.top1']:.1f}%"
               for case in ("state_on_on", "state_off_on", "state_on_off")}
    verdict = DOCUMENTED if same and garbage else (PASS if same else FAIL)
    return Check("e", f"saved state across rotation settings ({model}, q8_0/q8_0)", verdict,
                 figures, "a session carries no rotation flag: saved with rotation off and "
                 "loaded with it on (or the reverse) it is silently wrong, as upstream "
                 "(#28498); keep LLAMA_ATTN_ROT_DISABLE the same when saving and loading")
