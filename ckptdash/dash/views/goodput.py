"""The goodput panel: saving share, preemptions, work lost, the Young/Daly interval."""

from __future__ import annotations

from ckptdash import humanize
from ckptdash.analysis import preemption
from ckptdash.dash.views.text import esc
from ckptdash.dash.views.widgets import HtmlView


class GoodputView(HtmlView):
    """Work lost per preemption, saving share, preemption rate, Young/Daly interval."""

    def html(self) -> str:
        snap = self.model.run
        return "" if snap is None else render_goodput(preemption.compute(snap))


def render_goodput(g: preemption.PreemptionCost) -> str:
    """The goodput panel's HTML."""
    d = humanize.duration
    lines = [
        "<h4>Goodput</h4>",
        f"<div>saving: <b>{humanize.percent(g.saving_share)}</b> of {d(g.wall_s)} wall time"
        f" <span class='muted'>({g.saves} saves, {d(g.saving_s)})</span></div>",
    ]
    n = len(g.preemptions)
    rate = f"{g.per_hour:.2f} /h" if g.per_hour is not None else humanize.DASH
    unwarned = f", {g.unwarned} without a signal" if g.unwarned else ""
    lines.append(
        f"<div>preemptions: <b>{n}</b> <span class='muted'>({rate}{unwarned})</span>"
        f" · work lost: <b>{d(g.lost_s) if n else humanize.DASH}</b></div>"
    )
    if g.young_s is not None:
        interval = d(g.interval_s) if g.interval_s is not None else "no periodic saves"
        lines.append(
            f"<div>checkpoint interval: this run <b>{interval}</b> · Young"
            f" <b>{d(g.young_s)}</b> · Daly <b>{d(g.daly_s)}</b>"
            f" <span class='muted'>(save cost {d(g.save_cost_s)}, MTBF {d(g.mtbf_s)})</span></div>"
        )
        now_w, best_w = g.waste(g.interval_s), g.waste(g.daly_s)
        if now_w is not None and best_w is not None:
            lines.append(
                f"<div class='muted'>expected time lost to saving and re-done work:"
                f" {humanize.percent(now_w)} now, {humanize.percent(best_w)}"
                " at the Daly interval</div>"
            )
        if best_w is not None:
            now_g = humanize.percent(max(0.0, 1 - now_w)) if now_w is not None else humanize.DASH
            lines.append(
                f"<div class='gp-advice'>expected goodput at the Daly interval:"
                f" <b>{humanize.percent(max(0.0, 1 - best_w))}</b>"
                f" <span class='muted'>(at this run's interval {now_g}; startup and queue"
                " time not included)</span></div>"
            )
    else:
        lines.append(
            "<div class='muted'>optimal interval (Young/Daly): needs at least one preemption"
            " and one timed save</div>"
        )
    if g.preemptions:
        rows = "".join(_preemption_row(p) for p in g.preemptions[-8:])
        lines.append(
            "<table><tr><th>attempt</th><th>signal</th><th>signal → durable</th>"
            f"<th>durable → requeue</th><th>work lost</th></tr>{rows}</table>"
        )
    return '<div class="ck">' + "".join(lines) + "</div>"


def _preemption_row(p: preemption.Preemption) -> str:
    d = humanize.duration
    requeue = "" if p.requeue_t is None else (" issued" if p.requeue_issued else " refused")
    steps = "" if p.lost_steps is None else f" ({p.lost_steps} steps)"
    return (
        f"<tr><td>{p.attempt}</td><td>{esc(p.signal or 'no signal')}</td>"
        f"<td>{d(p.signal_to_save_s)}</td><td>{d(p.save_to_requeue_s)}{requeue}</td>"
        f"<td>{d(p.lost_s)}{steps}</td></tr>"
    )
