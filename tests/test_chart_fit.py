"""Charts that never clip: every chart the chapters, the sliders and the report draw, rendered in
Chromium, keeps each of its texts inside its SVG (and inside the clip of the group it is drawn in),
no text overlaps another, and no label is cut short with "…".

How: the SVGs (vl-convert, as the notebooks and the report make them) go into one page, each in its
own box, and a script measures every visible ``<text>`` with ``getBoundingClientRect`` against the
box of its ``<svg>``. A text hidden by Vega (overlapping axis labels get ``opacity="0"``) does not
count. One browser, one page, all the SVGs at once.

- ``test_the_check_sees_clipping``: the measurement itself finds a text off the edge, one cut by its
  clip and an ellipsis (so a pass below means something);
- ``test_slider_charts_fit`` (slow, ~100 redraws): every explorer at its start, with each control at
  each end of its range, and with all controls at their lower and at their upper ends;
- ``test_chapter_and_report_charts_fit`` (slow, ~2 min): the charts of a full audit of the example
  (recorded measurements replayed, as in test_browser), which are the report's charts; screenshots of
  the report's pages kept in ``.pytest_cache/artifacts/report-fit-*.png``.
"""
from __future__ import annotations

import html

import pytest

from browser_helpers import browser, keep_artifact, skip_reason
from preflight.reporting.html import scoped_svg

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

TOLERANCE_PX = 1.0

MEASURE_JS = """(tol) => {
  const hidden = el => {
    for (let a = el; a && a.tagName !== 'svg'; a = a.parentElement)
      if (a.getAttribute('opacity') === '0' || a.getAttribute('visibility') === 'hidden') return true;
    return false;
  };
  const clips = el => {            // on-screen boxes of the clip paths around el
    const out = [];
    for (let a = el.parentElement; a && a.tagName !== 'svg'; a = a.parentElement) {
      const ref = a.getAttribute('clip-path');
      const m = ref && ref.match(/#([^)"']+)/);
      const shape = m && a.ownerSVGElement.querySelector('[id="' + m[1] + '"] > *');
      if (!shape) continue;
      const b = shape.getBBox(), t = a.getScreenCTM();
      const p = new DOMPoint(b.x, b.y).matrixTransform(t);
      const q = new DOMPoint(b.x + b.width, b.y + b.height).matrixTransform(t);
      out.push({left: Math.min(p.x, q.x), right: Math.max(p.x, q.x), top: Math.min(p.y, q.y),
                bottom: Math.max(p.y, q.y)});
    }
    return out;
  };
  const outside = (r, box) => r.left < box.left - tol || r.right > box.right + tol ||
                              r.top < box.top - tol || r.bottom > box.bottom + tol;
  return [...document.querySelectorAll('div.chart')].map(div => {
    const svg = div.querySelector('svg'), box = svg.getBoundingClientRect(), problems = [], seen = [];
    for (const t of svg.querySelectorAll('text')) {
      const text = t.textContent.trim();
      if (!text || hidden(t)) continue;
      const r = t.getBoundingClientRect();
      for (const [other, o] of seen)
        if (Math.min(r.right, o.right) - Math.max(r.left, o.left) > tol &&
            Math.min(r.bottom, o.bottom) - Math.max(r.top, o.top) > tol)
          problems.push(`${JSON.stringify(text)} overlaps ${JSON.stringify(other)}`);
      seen.push([text, r]);
      if (outside(r, box)) problems.push(`${JSON.stringify(text)} leaves the chart (left ${
        (box.left - r.left).toFixed(0)}, right ${(r.right - box.right).toFixed(0)}, top ${
        (box.top - r.top).toFixed(0)}, bottom ${(r.bottom - box.bottom).toFixed(0)} px)`);
      else if (clips(t).some(c => outside(r, c))) problems.push(`${JSON.stringify(text)} is cut by its clip`);
      if (text.includes('\\u2026')) problems.push(`${JSON.stringify(text)} is cut short`);
    }
    return [div.dataset.name, problems];
  });
}"""


def clipped_texts(page, svgs: dict[str, str]) -> dict[str, list[str]]:
    """``{chart name: [what is wrong with which text]}`` for the SVGs ``{name: svg}``, measured in
    ``page`` (a playwright page): only the charts with a problem."""
    boxes = "".join(f"<div class='chart' data-name='{html.escape(name)}' style='margin:6px'>"
                    f"{scoped_svg(svg, f'c{i}')}</div>" for i, (name, svg) in enumerate(svgs.items()))
    page.set_content(f"<!DOCTYPE html><html><body style='margin:0'>{boxes}</body></html>")
    return {name: problems for name, problems in page.evaluate(MEASURE_JS, TOLERANCE_PX) if problems}


@pytest.fixture(scope="module")
def page():
    with browser() as b:
        yield b.new_page(viewport={"width": 1400, "height": 900})


def test_the_check_sees_clipping(page):
    svg = ('<svg xmlns="http://www.w3.org/2000/svg" width="200" height="80" viewBox="0 0 200 80">'
           '<defs><clipPath id="k"><rect x="0" y="0" width="60" height="80"/></clipPath></defs>'
           '<text x="150" y="20" font-size="12">runs off the right edge</text>'
           '<g clip-path="url(#k)"><text x="10" y="40" font-size="12">cut by the clip path</text></g>'
           '<text x="10" y="60" font-size="12">label…</text>'
           '<text x="12" y="61" font-size="12">on top</text>'
           '<text x="10" y="75" font-size="12" opacity="0">hidden, not counted, off the edge too</text></svg>')
    ok = (svg.replace("runs off the right edge", "fits").replace("cut by the clip path", "in").replace("…", "")
          .replace("on top", ""))
    found = clipped_texts(page, {"bad": svg, "good": ok})
    assert list(found) == ["bad"], found
    assert [p.split('"')[1] for p in found["bad"]] == ["runs off the right edge", "cut by the clip path", "label…",
                                                       "on top"], found


def _ends(control) -> list:
    """The values at a control's ends: a slider's lowest and highest, every option of a menu."""
    import ipywidgets as W

    from test_slider_ranges import _ends as every_value

    values = every_value(control)
    return [values[0], values[-1]] if isinstance(control, W.SelectionSlider) else values


def _slider_states():
    """Every explorer at its start, each control at each end, and all at their lower/upper ends."""
    from test_slider_ranges import _explorers

    for name, make in _explorers().items():
        box = make()
        controls = list(box.children[1].children)
        start = [c.value for c in controls]
        yield f"{name} at start", box.children[3].value
        for i, c in enumerate(controls):
            for v in _ends(c):
                c.value = v
                yield f"{name}: {c.description} = {v}", box.children[3].value
            c.value = start[i]
        for end in (0, -1):
            for c in controls:
                c.value = _ends(c)[end]
            yield f"{name}: all controls at their {'lower' if end == 0 else 'upper'} ends", box.children[3].value
            for c, v in zip(controls, start):
                c.value = v


@pytest.mark.slow          # ~100 redraws: 30 s on an idle 2-core CPU, 2 min on a busy one
def test_slider_charts_fit(page):
    svgs = dict(_slider_states())
    assert len(svgs) > 60, len(svgs)
    assert clipped_texts(page, svgs) == {}


@pytest.mark.slow
def test_chapter_and_report_charts_fit(page, tmp_path):
    """Screenshots of the report's pages are kept in .pytest_cache/artifacts/report-fit-*.png."""
    from conftest import records_of_this_machine, run_cli

    results, profile = records_of_this_machine(tmp_path)
    out = tmp_path / "report"
    r = run_cli("audit", profile, "--out", out, "--results", results)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    svgs = {p.stem: p.read_text() for p in sorted((out / "charts").glob("*.svg"))}
    assert len(svgs) >= 20, sorted(svgs)
    assert clipped_texts(page, svgs) == {}
    for p in [out / "index.html", *sorted(out.glob("0[1-5]_*.html"))]:     # the pages, for a look
        page.set_viewport_size({"width": 1280, "height": 900})
        page.goto(p.as_uri(), wait_until="load")
        shot = tmp_path / f"report-fit-{p.stem}.png"
        page.screenshot(path=str(shot), full_page=True)
        keep_artifact(shot)
