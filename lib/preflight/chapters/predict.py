"""Predict, then measure: the exercises at the end of each chapter.

A number you predicted and then saw measured is remembered; a number you only read is not. Each
exercise is two cells. The first asks the question and leaves a variable for the learner::

    ask(EX["amdahl_256"])
    prediction = None        # your answer, in the unit asked

The second computes or measures the answer and gives feedback::

    check(EX["amdahl_256"], prediction)

With no prediction the answer stays hidden (``reveal=True`` shows it anyway: the headless audit
does not stop to ask). Feedback is one line: how far off the prediction was, on a log scale for
quantities that span orders of magnitude, the answer, and why it is what it is. ``check`` returns
None, so a notebook cell shows that line and no raw value; :func:`feedback` returns the same as a
:class:`Feedback` for tests. The answer is always computed by the library at run time (a formula on
the learner's own profile, or a live measurement), never stored in the notebook. A question must
not be one the chapter has already answered (``preflight.chapters.exercises`` says how each avoids it).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from preflight.core.numfmt import num, percent


@dataclass(frozen=True)
class Exercise:
    key: str
    question: str
    unit: str
    answer: Callable[[], float]        # computed (or measured) when checked
    why: str                           # the explanation shown with the answer
    rel_tol: float = 0.25              # "close" if within this relative error (log scale if log=True)
    log: bool = False                  # compare orders of magnitude (ratios, times, probabilities)


def grade(prediction: float, truth: float, rel_tol: float = 0.25, log: bool = False) -> tuple[str, float]:
    """``(verdict, error)``: verdict ``close`` / ``off`` / ``far off``; error relative (or the ratio
    on a log scale: 2.0 means a factor of two either way)."""
    if not math.isfinite(prediction):
        raise ValueError(f"prediction = {prediction!r}: expected a finite number")
    if log:
        if prediction <= 0 or truth <= 0:
            raise ValueError(f"prediction = {prediction!r}: expected a positive number")
        factor = max(prediction / truth, truth / prediction)
        return ("close" if factor <= 1 + rel_tol else "off" if factor <= 3 else "far off"), factor
    err = abs(prediction - truth) / abs(truth) if truth else abs(prediction)
    return ("close" if err <= rel_tol else "off" if err <= 3 * rel_tol else "far off"), err


def _show(markdown: str) -> None:
    try:
        from IPython.display import Markdown, display

        display(Markdown(markdown))
    except ImportError:       # plain Python: print it
        print(markdown)


def ask(ex: Exercise) -> None:
    """Show the question; the learner writes ``prediction_<key> = ...`` in the cell below it (the notebooks'
    convention), and runs the check cell further down once the answer is on the page."""
    _show(f"**Predict ({ex.key}).** {ex.question} *(answer in {ex.unit}; write it as `{variable(ex)} = ...` in the "
          "cell below and run it; its check cell comes further down, after the chapter shows the answer)*")


def variable(ex: Exercise) -> str:
    """The notebook variable that holds the learner's prediction for ``ex``."""
    return f"prediction_{ex.key}"


@dataclass(frozen=True)
class Feedback:
    """What :func:`check` shows: one line of Markdown (``text``) and the numbers behind it, for tests.
    ``error`` is the relative error (or the factor, on a log scale); ``problem`` says why a prediction
    could not be graded."""
    text: str
    revealed: bool = False
    answer: float | None = None
    verdict: str | None = None
    error: float | None = None
    problem: str | None = None


def feedback(ex: Exercise, prediction: float | None, reveal: bool = False) -> Feedback:
    """The feedback on ``prediction``, without showing it. The answer is not even computed until a
    prediction is made (or ``reveal=True``): a measured answer costs nothing while hidden."""
    if prediction is None and not reveal:
        return Feedback(f"No prediction yet: write a number after `{variable(ex)} =` in the cell under its question, "
                        "run that cell and this one again (or call `check(..., reveal=True)` to see the answer).")
    if prediction is not None:
        try:
            prediction = float(prediction)
        except (TypeError, ValueError):
            return Feedback(f"`{variable(ex)} = {prediction!r}` is not a number: write e.g. `{variable(ex)} = 12.5`.",
                            problem="not a number")
    truth = float(ex.answer())
    answer = f"**Answer: {num(truth)} {ex.unit}.** {ex.why}"
    if prediction is None:
        return Feedback(answer, revealed=True, answer=truth)
    try:
        verdict, err = grade(prediction, truth, ex.rel_tol, ex.log)
    except ValueError as e:
        return Feedback(f"{e}. {answer}", revealed=True, answer=truth, problem=str(e))
    if ex.log:
        how = f"a factor of {num(err)} from the answer"
    elif ex.unit == "%":            # a share: say the points, then the relative error (two percentages read alike)
        how = f"{num(abs(prediction - truth))} percentage points from the answer"
    else:
        how = f"{percent(err)} from the answer"
    return Feedback(f"Your prediction {num(prediction)} {ex.unit} is **{verdict}** ({how}). {answer}",
                    revealed=True, answer=truth, verdict=verdict, error=err)


def check(ex: Exercise, prediction: float | None, reveal: bool = False) -> None:
    """Show the feedback on ``prediction`` (:func:`feedback`) as one line. Returns None, so the cell
    shows that line and nothing else."""
    _show(feedback(ex, prediction, reveal).text)
