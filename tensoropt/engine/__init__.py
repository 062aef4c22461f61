"""The Frontier Tracking engine: exact time/memory Pareto frontiers over a cost graph.

No torch here. Start at ``solver.py``: its docstring states the recurrence and points
each step to the function that carries it out.
"""

from .costgraph import CostGraph
from .factors import SolveTimeout
from .pareto import choice, covers, pareto, series_sum
from .solver import SolveResult, solve

__all__ = ["CostGraph", "SolveResult", "SolveTimeout", "solve", "pareto", "series_sum", "choice", "covers"]
