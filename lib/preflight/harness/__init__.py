"""What the measurement methods (``preflight.bench``) run on: launching ranks, the reference models,
the training loop, NVML sampling, op categories, the emulated device, the chapter-2 dataset,
saved-tensor counting, progress lines. Not a public API: the methods are."""
