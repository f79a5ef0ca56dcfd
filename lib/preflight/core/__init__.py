"""The contracts every layer shares: the profile, findings, records, the hardware table, the device,
timing, atomic writes, numbers for people, the workload contract. Nothing here imports another wing
(but ``models.states``'s framework table, which the profile validates against)."""
