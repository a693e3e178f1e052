"""Exception classes of graph_pass. Every message names the node (or input) at fault and the fix."""

__all__ = ["GraphPassError", "LoadError", "ConfigError", "PlanError", "ValidationError", "PlanFormatError"]


class GraphPassError(Exception):
    """Base class of every error graph_pass raises."""


class LoadError(GraphPassError):
    """The partition graphs cannot be read: bad bytes, an unknown input type, a dangling input."""


class ConfigError(GraphPassError, ValueError):
    """A planner setting is out of range; the message names the setting and its valid range."""


class PlanError(GraphPassError):
    """The transfers cannot be planned consistently (e.g. two `_Send` nodes with one rendezvous key)."""


class PlanFormatError(GraphPassError, ValueError):
    """A serialized plan has the wrong schema or version, or a missing field."""


class ValidationError(GraphPassError):
    """A plan breaks an invariant. ``problems`` lists one message per broken invariant.

    Args:
        problems: the messages, each naming the node or region at fault and the fix.
    """

    def __init__(self, problems):
        self.problems = list(problems)
        head = f"plan is invalid ({len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}):"
        super().__init__("\n  - ".join([head] + self.problems))
