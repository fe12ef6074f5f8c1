"""Pipeline stages (load, transfer, compute, write) that every strategy composes."""

from cadence.core.batch import Batch, BatchPlan, plan_epoch
from cadence.pipeline.stages import ComputeStage, LoadStage, Stages, WriteStage
from cadence.pipeline.transfer import DeviceLink

__all__ = ["Batch", "BatchPlan", "ComputeStage", "DeviceLink", "LoadStage", "Stages", "WriteStage",
           "plan_epoch"]
