"""Pipeline stages (load, transfer, compute, write) that every strategy composes."""

from cadence.pipeline.batch import Batch, BatchPlan, plan_epoch
from cadence.pipeline.stages import ComputeStage, LoadStage, Stages, TransferStage, WriteStage

__all__ = ["Batch", "BatchPlan", "ComputeStage", "LoadStage", "Stages", "TransferStage",
           "WriteStage", "plan_epoch"]
