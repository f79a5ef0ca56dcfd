"""The audit's machinery: the chapter runtime notebooks start with, the headless audit (plan-only in
this process, measure mode a kernel per chapter), ``check``, a workload's pre-flight, scratch folders."""
