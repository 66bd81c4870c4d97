"""Traffic for any declared scenario: simulated users through a running gateway (`simulate`), or
offline samples recorded as the gateway would (`offline`); both ask the scenario's tasks and
score with its reward."""
