"""The toy tasks, at the path the public contract names (`from model.tasks import TASKS`).

They live in model/toy/tasks.py since the toy world got its own package; this module only re-exports
them, so the documented import keeps working."""

from model.toy.tasks import SPLITS, TASKS, InputProblem, Task

__all__ = ["SPLITS", "TASKS", "InputProblem", "Task"]
