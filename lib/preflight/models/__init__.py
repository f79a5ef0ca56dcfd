"""Pure formulas: no torch import here, so the plan-only audit and the sliders stay fast."""
