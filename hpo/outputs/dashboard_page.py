"""What optuna-dashboard's study page shows of a collapse study, beyond its own layout.

optuna-dashboard places a study's plotly figures in half-width cards below its history, importance and
timeline plots (about 1,300 px down on a 1400 px wide screen), and shows each study user attr as its raw JSON
(the reference surrogate: a block of constants and bands). `page_app` wraps the dashboard's WSGI app:

- the page (``/dashboard...``) gets a style sheet that puts the card of the collapse figure
  (``hpo/outputs/dashboard.py`` ``FIGURE_ID``) first on the study page and at full width (CSS ``order`` and
  ``flex-basis``; the page's own elements are not moved, so its React code never sees a change);
- the study's JSON (``/api/studies/<id>``) shows the reference attrs (``collapse_reference``,
  ``collapse_reference_used``) as a one-line summary (`reference_summary`): the fitted constants, the
  reference ranges and how many curves it was fitted on. The study in the storage is not changed.

Only GET answers with status 200 and no content encoding are rewritten; everything else passes through.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from collapse_hpo.hpo.outputs.dashboard import FIGURE_ID
from collapse_hpo.hpo.rule.record import STUDY_REFERENCE_ATTR, USED_REFERENCE_ATTR
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.surrogate import Surrogate

#: The element optuna-dashboard draws a saved figure into (``user-defined-plot:<id>``).
PLOT_ELEMENT = f"user-defined-plot:{FIGURE_ID}"
#: Height of the figure at full width (optuna-dashboard gives every saved figure 450 px).
FIGURE_HEIGHT_PX = 560
#: The study page's layout: the grid that holds the figure's card goes first, the card spans the row.
PAGE_STYLE = f"""<style id="collapse-hpo-page">
/* collapse-hpo (hpo/outputs/dashboard_page.py): the collapse figure first on the study page, at full width */
main .MuiGrid-container:has([id="{PLOT_ELEMENT}"]) {{ order: -1; }}
main .MuiGrid-container > .MuiGrid-root:has([id="{PLOT_ELEMENT}"]) {{
  order: -1; flex-basis: 100%; max-width: 100%; width: 100%;
}}
[id="{PLOT_ELEMENT}"] {{ height: {FIGURE_HEIGHT_PX}px !important; }}
</style>"""
_STUDY_API = re.compile(r"/api/studies/(\d+)")
_SUMMARIZED = (STUDY_REFERENCE_ATTR, USED_REFERENCE_ATTR)


def _num(x: float) -> str:
    return format(float(x), ".3g")


def _range(name: str, lo_hi: Any) -> str | None:
    if isinstance(lo_hi, list | tuple) and len(lo_hi) == 2:
        lo, hi = (_num(v) for v in lo_hi)
        return f"{name} {lo}" if lo == hi else f"{name} {lo}–{hi}"
    return None


def surrogate_summary(s: Surrogate) -> str:
    """One line: b(τ) and q(TPP) with their fitted constants, m, the reference ranges, the number of curves
    it was fitted on and the fractions its error model covers."""
    b = f"b = {_num(s.b_c)}" + (f"·τ^{_num(s.b_e)}" if s.tau_law == "power" else " (constant)")
    q = f"q = {_num(s.q_c)}" + (f"·TPP^{_num(s.q_e)}" if s.tpp_law == "power" else " (constant)")
    parts = [f"{b}, {q}, m = {_num(s.m)}"]
    n = s.info.get("n_curves") if isinstance(s.info, dict) else None
    ranges = [r for r in (_range("τ", s.reference.get("tau")), _range("TPP", s.reference.get("tpp")),
                          _range("N", s.reference.get("params"))) if r]
    fitted = f"fitted on {n} curves" if isinstance(n, int) else "fitted on reference curves"
    parts.append(fitted + (f" ({', '.join(ranges)})" if ranges else ""))
    if s.error_bands:
        fr = [e.fraction for e in s.error_bands]
        parts.append(f"error model at t̂ {_num(min(fr))}–{_num(max(fr))}")
    else:
        parts.append("no error model")
    if s.scaling_law is not None:
        parts.append("with a final-loss law L(N, D)")
    return "; ".join(parts)


def reference_summary(key: str, value: Any) -> str | None:
    """The summary shown for the study attr ``key`` (one of the reference attrs) holding ``value``; None when
    it is not one of them or cannot be read (then the raw value is shown)."""
    if key not in _SUMMARIZED or not isinstance(value, dict):
        return None
    try:
        s = Surrogate.from_dict(value.get("surrogate"), source=f"study attr {key}")
    except InputError:
        return None
    if key == STUDY_REFERENCE_ATTR:
        trials = value.get("trials") or []
        shown = ", ".join(str(t) for t in trials[:12]) + (", …" if len(trials) > 12 else "")
        head = f"online fit on {len(trials)} completed trial(s) ({shown})"
    else:
        head = f"reference {value.get('label') or 'surrogate'}"
    return f"{head}: {surrogate_summary(s)}"


def page_app(app: Callable[..., Iterable[bytes]], storage: Any) -> Callable[..., Iterable[bytes]]:
    """``app`` (optuna-dashboard's WSGI app on ``storage``, a URL or an Optuna storage) with the study page's
    layout and the reference summaries (module docstring)."""
    opened: dict[str, Any] = {}

    def study_attrs(study_id: int) -> dict[str, Any]:
        if "storage" not in opened:
            import optuna

            opened["storage"] = optuna.storages.get_storage(storage) if isinstance(storage, str) else storage
        return opened["storage"].get_study_user_attrs(study_id)

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = str(environ.get("PATH_INFO", ""))
        study = _STUDY_API.fullmatch(path)
        page = path == "/dashboard" or path.startswith("/dashboard/")
        if str(environ.get("REQUEST_METHOD", "GET")).upper() != "GET" or not (page or study):
            return app(environ, start_response)
        seen: dict[str, Any] = {}
        chunks: list[bytes] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[..., Any]:
            seen["status"], seen["headers"], seen["exc_info"] = status, headers, exc_info
            return chunks.append  # the legacy write() callable

        result = app(environ, capture)
        try:
            chunks.extend(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        status, headers = seen["status"], list(seen["headers"])
        body = b"".join(chunks)
        encoded = any(k.lower() == "content-encoding" for k, _ in headers)
        if status.startswith("200") and not encoded:
            try:
                body = _with_style(body) if page else _with_summaries(body, lambda: study_attrs(
                    int(study.group(1))))
            except Exception:  # never break the dashboard over a summary: serve its own answer
                body = b"".join(chunks)
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            headers.append(("Content-Length", str(len(body))))
        start_response(status, headers, seen["exc_info"])
        return [body]

    return wrapped


def _with_style(html: bytes) -> bytes:
    text = html.decode("utf-8")
    if "</head>" not in text or 'id="collapse-hpo-page"' in text:
        return html
    return text.replace("</head>", PAGE_STYLE + "</head>", 1).encode("utf-8")


def _with_summaries(body: bytes, attrs: Callable[[], dict[str, Any]]) -> bytes:
    data = json.loads(body)
    entries = data.get("user_attrs") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not any(
            isinstance(e, dict) and e.get("key") in _SUMMARIZED for e in entries):
        return body
    stored = attrs()  # the full values: the dashboard's JSON cuts each value at 1,024 characters
    for e in entries:
        if isinstance(e, dict) and e.get("key") in _SUMMARIZED:
            summary = reference_summary(e["key"], stored.get(e["key"]))
            if summary is not None:
                e["value"] = summary
    return json.dumps(data).encode("utf-8")
