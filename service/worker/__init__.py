"""`lifelong worker`: the reference worker runner for places without Kubernetes.

Sedna's global manager turns every train/eval "ready" status into a pod. Without Kubernetes
something else has to: this runner listens upstream, and for each ready message runs the
user's command with the environment a Sedna worker pod gets (NAMESPACE, JOB_NAME,
WORKER_NAME, TRAIN_DATASET_URL or TEST_DATASET_URL, MODEL_URLS, OUTPUT_URL,
ORIGINAL_DATASET_URL, LC_SERVER; and DEPLOYED_MODEL_URL for the eval of a job with a deploy
condition), reports `running`, and then `completed` with the results the command wrote to
`$LIFELONG_RESULTS_FILE`, or `failed` with its exit code and stderr tail.

Why it looks the way it does:
- Upstream delivery is at least once, so ready messages are deduplicated by `header.id`, and
  the MQTT session is persistent with the PUBACK sent only after the final report: a runner
  killed mid-task gets the message again and reruns it.
- Tasks run one at a time, in arrival order: a reference runner for one edge box, where two
  trainings at once would only compete for the same cores.
- Reports go over MQTT (`{prefix}/{node}/workers/{namespace}/{worker}/info`, the topic the
  broker's ACL lets the node's runner publish for every namespace) or, with `--lc-server`,
  to the controller's HTTP endpoint, which is also what Sedna's own worker library posts to
  (LC_SERVER + /sedna/workers/{WORKER_NAME}/info). Workers are named for their round
  (`{job}-{kind}-{version}`), which binds their reports to it. A library-driven worker
  reports its own completion first; the runner's later report of the same stage is then
  refused (the stage is over) and changes nothing.
- Commands run in their own session so a Ctrl-C at the terminal reaches the runner, which
  then ends the command's whole process group itself.
- Ready messages and commands are not trusted: a ready message's names and output dir are
  checked before they become paths, and a command gets a minimal environment, never the
  runner's own settings (the broker password, the HTTP token).

The package: `tasks` (ready message -> task, the command's environment), `commands` (running
a command, reading its results), `reports` (MQTT and HTTP reporters), `runner` (the loop),
`cli` (`lifelong worker`).
"""

from service.worker.cli import register, settings_from_args
from service.worker.commands import Outcome, Stopped, read_results, run_command
from service.worker.reports import HttpReporter, MqttReporter, worker_message
from service.worker.runner import Worker, default_lc_server
from service.worker.tasks import Task, WorkerSettings, parse_ready, task_env

__all__ = [
    "HttpReporter",
    "MqttReporter",
    "Outcome",
    "Stopped",
    "Task",
    "Worker",
    "WorkerSettings",
    "default_lc_server",
    "parse_ready",
    "read_results",
    "register",
    "run_command",
    "settings_from_args",
    "task_env",
    "worker_message",
]
