"""The network model that the planner and the simulator share: links and hosts (``network``) and what
a schedule puts on them, step by step (``traffic``). It sits below both, so neither imports the other."""
