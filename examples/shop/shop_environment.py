"""The shop scenario's environment: executes the agent's `price(item)` calls against the task's
hidden price (each task row has its own `item` and `price`; the model sees neither price nor row).

Reef calls `Shop()` once per eval run (or simulated client) and `execute(task, call)` per tool call;
what it returns is the `tool` message the model reads next.
"""


class Shop:
    def execute(self, task, call):
        if call.name != "price":
            return f"error: there is no tool named {call.name!r}; use price(item)"
        item = call.arguments.get("item") if isinstance(call.arguments, dict) else None
        if item != task["item"]:
            return f"error: the shop has no item {item!r}"
        return f"{item}: {task['price']}"
