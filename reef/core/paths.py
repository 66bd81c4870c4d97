"""Where things live on disk: the names of the files other layers agree on.

A candidate folder holds `candidate.json` (its kind, lineage and metrics) beside the weights, and
both the recipe that writes it and the sampler that loads it must agree on the name.
"""

CANDIDATE_FILE = "candidate.json"
