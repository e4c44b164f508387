"""Service configuration: environment variables, `lifelong serve` flags, Sedna fallbacks.

Every setting has one LIFELONG_ variable and, unless it is a secret (which a flag would show
in the process list), one flag; a flag beats the variable, the
variable beats Sedna's own name (so a Sedna LC manifest works unchanged), and that beats the
default. A bad value stops start-up with a ConfigError of one line that names where the value
came from (variable or flag) and never echoes a password.

- `values`: one parser per kind of value (URLs, names, durations, sizes, tokens, paths).
- `settings`: the table of settings and where a raw value is looked up.
- `controller`: `Config`, the validated settings and the topics and addresses they make.
- `flags`: the settings as flags, and as the environment of another process.

The names other code uses are importable from this package.
"""

from service.config.controller import Config
from service.config.flags import add_arguments, environment, from_args, node_name_chosen
from service.config.values import LogFormat, node_name_problem

__all__ = [
    "Config",
    "LogFormat",
    "add_arguments",
    "environment",
    "from_args",
    "node_name_chosen",
    "node_name_problem",
]
