"""`make demo`: the learning loop on the default model with examples/sentiment, live (`run.py`, `loop.py`)."""
