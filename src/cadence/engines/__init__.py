"""Where code runs: threads of this process (``threads``), Ray actors (``ray``, imported only when a
run uses it) and the direct channel between processes (``channel``). Nothing here names a strategy."""
