"""Tasks: *what* is learned from a batch. One module per task, registered in ``TASKS`` by name
(``task: kge | ctr | mf | w2v | image``)."""

from cadence.tasks.base import TASKS, ParameterView, TablePart, TableSpec, Task, Validation
from cadence.tasks import ctr, image, kge, mf, w2v  # noqa: F401,E402  (register the tasks)

__all__ = ["TASKS", "ParameterView", "TablePart", "TableSpec", "Task", "Validation"]
