"""Pure formulas: no torch import here, so the plan-only audit and the sliders stay fast."""

# The share of a chip's dense peak the step model accepts as an efficiency (an MFU): ``advise
# --efficiency``, ``--mfu-from`` and chapter 1's measured MFU alike. Kept here: the command line reads it
# without importing the models.
EFFICIENCY_RANGE = (0.01, 1.0)
