"""How much an inbound message may hold: the caps every decoder enforces, and how much of a
refused message its rejection record carries.

The whole message's caps are checked on its bytes before it is parsed
(`service.wire.json_input.check_shape`); the free-form fields' own caps when they are reached.
"""

# Every inbound message, before it is parsed. What parsing costs is mostly one allocation per
# array or object (and the garbage collector's walks over them), then a little per value: the
# caps below keep the worst message under the size limit to milliseconds of CPU (bench
# figure 9: ~17 ms, where a 1 MiB report of 62-deep lists cost 0.5-1.3 s, twice).
MAX_PAYLOAD_BYTES = 1 << 20
MAX_NESTING_DEPTH = 64
#: Arrays and objects in one message (a Sedna job has about a hundred, a report a few).
MAX_CONTAINERS = 10_000
#: Values in one message, counted as the commas between them (a report with two models and
#: a few 1,000-number metric lists has a few thousand).
MAX_VALUES = 100_000
# Free-form fields, each within the message's caps and with caps of its own, because they are
# kept, stored or passed on to others.
#: A report's `ownerInfo`: forwarded upstream with every status of the job it reports.
MAX_OWNER_INFO_BYTES = 64 * 1024
MAX_OWNER_INFO_DEPTH = 8
#: A report's `results`: each a free-form object (a model is `{format, url, metrics}`).
MAX_RESULTS = 100
MAX_RESULT_DEPTH = 8
#: The numbers in one list of a result's `metrics` (name -> list of numbers).
MAX_METRIC_VALUES = 1000
#: A pod template (`trainSpec`, `evalSpec`, `deploySpec`): stored and passed on, never read.
MAX_TEMPLATE_BYTES = 256 * 1024
MAX_TEMPLATE_DEPTH = 32
#: A resource's annotations together, keys and values: Kubernetes's own limit.
MAX_ANNOTATIONS_BYTES = 256 * 1024
#: The head of a refused message its rejection record carries (base64).
REJECTION_PAYLOAD_BYTES = 4096
#: The longest path or URL (outputDir, dataset url, a model's url).
MAX_URL_CHARS = 4096
#: The longest worker name: a DNS-1123 subdomain.
MAX_WORKER_NAME_CHARS = 253
#: The most digits a round number has in a worker's name: an int64's (versions below 10**19).
MAX_VERSION_DIGITS = len(str(2**63 - 1))
#: What a job's worker names add to the job's name: `lifelong worker` names its workers
#: `{job}-train-{version}` and `{job}-eval-{version}`, an inference worker is named
#: `{job}-inference-{suffix}` (a suffix of at least one character). The longest decides.
WORKER_NAME_OVERHEAD = max(
    len("-train-") + MAX_VERSION_DIGITS,
    len("-eval-") + MAX_VERSION_DIGITS,
    len("-inference-") + 1,
)
#: The longest job name whose every worker name fits `MAX_WORKER_NAME_CHARS` (227): a
#: longer one could never hear a report, so it is refused when the job arrives.
MAX_JOB_NAME_CHARS = MAX_WORKER_NAME_CHARS - WORKER_NAME_OVERHEAD
