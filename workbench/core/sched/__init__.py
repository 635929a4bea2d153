"""Scheduling (vLLM v1's `v1/core/sched`): the Scheduler, its step message SchedulerOutput,
the waiting-queue policies, the stop check, the scheduler-side KV connector Protocol."""
