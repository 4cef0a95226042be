"""The kv-rotation feature's checks (docs/rotation.md, "What a correct port must show").

  a  rotation off is a no-op: f16 cache, and q8_0 with LLAMA_ATTN_ROT_DISABLE=1, give logits
     bit-identical to the unpatched build;
  b  rotation on: KLD and top-1 against the f16 run equal upstream's own rotation;
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
from portkit.validate import AS_UPSTREAM, DOCUMENTED, FAIL, PASS, Check, Context, Runner

QUICK_CONFIGS = ("q8_0/q8_0", "q4_0/q4_0")
FULL_CONFIGS = ("q8_0/q8_0", "q8_0/q4_0", "f16/q4_0", "q4_0/q4_0")
KLD_TOLERANCE = 0.01  # relative, against upstream's figure
SHIFT_FACTOR, SHIFT_SLACK = 1.5, 0.005  # patched shift KLD <= factor * unpatched + slack


def run(ctx: Context) -> tuple[list[str], list[Check]]:
    chosen = ctx.models or ([QUICK_MODEL, FULL_MODEL] if ctx.full else [QUICK_MODEL])
    checks: list[Check] = []
    for model in chosen:
        configs: tuple[str, ...] = FULL_CONFIGS if ctx.full else QUICK_CONFIGS
        table = ctx.published.get(model, {})
        if ctx.live is None and table:
            configs = tuple(c for c in configs if c in table) or configs
        checks.append(check_noop(ctx.runner, model))
        checks += check_quality(ctx.runner, model, configs, ctx.live, table)
        checks.append(check_shift(ctx.runner, model, ("q8_0/q8_0", "q4_0/q4_0") if ctx.full
                                  else ("q8_0/q8_0",), ctx.live))
        checks.append(check_state(ctx.runner, model))
    return chosen, checks


def check_noop(r: Runner, model: str) -> Check:
    figures: dict[str, Any] = {}
    same = True
    for config, disable in (("f16/f16", False), ("q8_0/q8_0", True)):
        a = r.logits_digest("unpatched", model, config, disable=disable)
        b = r.logits_digest("patched", model, config, disable=disable)
        label = config + (" LLAMA_ATTN_ROT_DISABLE=1" if disable else "")
        figures[label] = "bit-identical" if a == b else "DIFFERENT"
        same = same and a == b
    shape = r.harness("patched", model, "logits", "f16/f16")
    figures["logits compared"] = (f"{int(shape['logits.tokens'])} tokens x "
                                  f"{int(shape['logits.vocab'])} (float32)")
    return Check("a", f"rotation off is a no-op ({model})", PASS if same else FAIL, figures)


def _expect(config: str, disable: bool, head_ok: bool = True) -> tuple[int, int]:
    ctk, ctv = config.split("/")
    on = not disable and head_ok
    return int(on and ctk != "f16"), int(on and ctv != "f16")


def check_quality(r: Runner, model: str, configs: tuple[str, ...], live: Runner | None,
                  table: dict[str, Any]) -> tuple[Check, Check]:
    base = r.ws.runs / f"{model}-f16.kld"
    r.perplexity("unpatched", model, "f16/f16", base=base, write_base=True)
    figures: dict[str, Any] = {}
    flags: dict[str, Any] = {}
    ok, flags_ok = True, True
    if live is not None:
        live_base = live.ws.runs / f"{model}-f16.kld"
        live.perplexity("unpatched", model, "f16/f16", base=live_base, write_base=True)
    for config in configs:
        off = r.perplexity("unpatched", model, config, base=base)
        dis = r.perplexity("patched", model, config, base=base, disable=True)
        on = r.perplexity("patched", model, config, base=base)
        ref_kld: float | None = None
        ref_top1: float | None = None
        source = "no reference"
        published = table.get(config, {}).get("on")
        if live is not None:
            ref_on = live.perplexity("unpatched", model, config, base=live_base)
            ref_kld, ref_top1, source = ref_on.kld, ref_on.top1, "upstream's build, same run"
        elif published:
            ref_kld, ref_top1 = published["kld"], published["top1"]
            source = "upstream's published figure"
        rel = abs(on.kld - ref_kld) / ref_kld if on.kld is not None and ref_kld else None
        good = rel is not None and rel <= KLD_TOLERANCE and dis.kld == off.kld
        ok = ok and good
        figures[config] = (
            f"off {off.kld} / {off.top1}%, disabled {dis.kld} / {dis.top1}%, on {on.kld} / "
            f"{on.top1}%; upstream on {ref_kld} / {ref_top1}% ({source})"
            + (f", KLD differs by {rel:.2%}" if rel is not None else "")
            + (f"; published (docs/fixtures.md): {published['kld']} / {published['top1']}%"
               if published and live is not None else ""))
        for label, res, disable in (("on", on, False), ("disabled", dis, True)):
            want = _expect(config, disable)
            got = (res.rot_k, res.rot_v)
            flags[f"{config} {label}"] = f"attn_rot_k = {got[0]}, attn_rot_v = {got[1]}"
            flags_ok = flags_ok and got == want
    f16 = r.perplexity("patched", model, "f16/f16", base=base)
    flags["f16/f16 on"] = f"attn_rot_k = {f16.rot_k}, attn_rot_v = {f16.rot_v}"
    flags_ok = flags_ok and (f16.rot_k, f16.rot_v) == (0, 0)
    return (Check("b", f"rotation on equals upstream's (KLD, top-1 vs f16; {model})",
                  PASS if ok else FAIL, figures,
                  f"tolerance {KLD_TOLERANCE:.0%} relative KLD; 'disabled' must equal 'off'"),
            Check("c", f"log lines report the rotation as configured ({model})",
                  PASS if flags_ok else FAIL, flags))


def check_shift(r: Runner, model: str, configs: tuple[str, ...],
                live: Runner | None) -> Check:
    """Pass: the port's shift is as good as the unpatched tree's and the broken port is
    caught. Where the port fails but upstream's own rotation fails identically, the verdict
    is "as upstream": the port is faithful, and the weakness is upstream's."""
    figures: dict[str, Any] = {}
    verdict = PASS
    for config in configs:
        res = {v: r.harness(v, model, "shift", config) for v in ("unpatched", "patched", "broken")}
        limit = SHIFT_FACTOR * res["unpatched"]["shift.kld"] + SHIFT_SLACK
        good = res["patched"]["shift.kld"] <= limit
        caught = res["broken"]["shift.kld"] > limit
        upstream = live.harness("unpatched", model, "shift", config) if live else None
        same = upstream is not None and upstream["shift.kld"] == res["patched"]["shift.kld"]
        text = ", ".join(f"{v} KLD {res[v]['shift.kld']:.6f} top-1 {res[v]['shift.top1']:.1f}%"
                         for v in res)
        if upstream is not None:
            text += f", upstream KLD {upstream['shift.kld']:.6f}"
        text += (f"; limit {limit:.6f}: patched {'passes' if good else 'FAILS'}"
                 + ("" if good or not same else " exactly as upstream's own rotation does")
                 + f", broken port {'fails as it must' if caught else 'PASSES (check too weak)'}")
        figures[config] = text
        if not caught or (not good and not same):
            verdict = FAIL
        elif not good and verdict == PASS:
            verdict = AS_UPSTREAM
    return Check("d", f"context shift of a rotated quantized K cache ({model})", verdict,
                 figures, "shifted cache vs the same tokens computed fresh at the shifted "
                 "positions")


def check_state(r: Runner, model: str) -> Check:
    res = r.harness("patched", model, "state", "q8_0/q8_0")
    same = res["state_on_on.kld"] == 0.0
    garbage = res["state_off_on.kld"] > 1.0 and res["state_on_off.kld"] > 1.0
    figures = {case: f"KLD {res[f'{case}.kld']:.6f}, top-1 {res[f'{case}.top1']:.1f}%"
               for case in ("state_on_on", "state_off_on", "state_on_off")}
    verdict = DOCUMENTED if same and garbage else (PASS if same else FAIL)
    return Check("e", f"saved state across rotation settings ({model}, q8_0/q8_0)", verdict,
                 figures, "a session carries no rotation flag: saved with rotation off and "
                 "loaded with it on (or the reverse) it is silently wrong, as upstream "
                 "(#28498); keep LLAMA_ATTN_ROT_DISABLE the same when saving and loading")
