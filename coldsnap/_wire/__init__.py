"""The records the orchestrator and coldsnap's plugin inside SGLang exchange, and the names of
SGLang's memory regions. The two sides never import each other; both import this package, so it
imports nothing heavy (attrs and coldsnap's leaves only).

- the engine's environment (`EngineSettings`: every COLDSNAP_* variable; the launcher writes it
  with `to_env()`, the plugin reads it with `EngineSettings.from_env()`);
- the resume plan (`ResumePlan`, under the engine's runtime directory: the engine adapter
  writes it with `write_plan` before it asks SGLang to resume the weights, the plugin reads it
  with `read_plan`);
- the status record the plugin keeps per process (`status_path`), read as one typed record
  (`ProcessStatus`, `read_status`) with a scheduler's release report and its rank resume;
- the engine's API key (`write_key`, `read_key`: a 0600 file in the runtime directory, which the
  plugin checks requests against).

Every record on disk carries `format` and `kind`; writes are atomic (temporary file, fsync,
rename).
"""

from ._env import (
    BOOL_VALUES,
    DEFAULT_RANK_TIMEOUT_S,
    LIVE_BACKINGS,
    MODES,
    RECOVERY_LOAD_FORMATS,
    SHAPE_CALIBRATIONS,
    STARTUP_SOURCES,
    VARIABLES,
    EngineSettings,
    SettingsError,
    load_settings,
    unknown_variables,
)
from ._key import KEY_FILE, ApiKey, KeyFileError, key_path, read_key, write_key
from ._plan import (
    CHECKPOINT_SOURCE,
    CUDA_GRAPH,
    FLAG_FALSE,
    FLAG_TRUE,
    FLAG_VALUES,
    KV_CACHE,
    MEMORY_TAGS,
    PAYLOAD_SOURCE,
    PLAN_FILE,
    PLAN_FORMAT,
    PLAN_KIND,
    SOURCES,
    STATUS_FORMAT,
    STATUS_KIND,
    WEIGHTS,
    FlagError,
    PlanError,
    ResumePlan,
    parse_flag,
    plan_from,
    read_plan,
    status_path,
    write_plan,
)
from ._status import (
    STATUS_FIELDS,
    ProcessStatus,
    RankResume,
    ReleaseReport,
    StatusError,
    StatusEvent,
    parse_status,
    read_status,
    read_status_as_written,
)

__all__ = [
    "BOOL_VALUES",
    "CHECKPOINT_SOURCE",
    "CUDA_GRAPH",
    "DEFAULT_RANK_TIMEOUT_S",
    "FLAG_FALSE",
    "FLAG_TRUE",
    "FLAG_VALUES",
    "KEY_FILE",
    "KV_CACHE",
    "LIVE_BACKINGS",
    "MEMORY_TAGS",
    "MODES",
    "PAYLOAD_SOURCE",
    "PLAN_FILE",
    "PLAN_FORMAT",
    "PLAN_KIND",
    "RECOVERY_LOAD_FORMATS",
    "SHAPE_CALIBRATIONS",
    "SOURCES",
    "STARTUP_SOURCES",
    "STATUS_FIELDS",
    "STATUS_FORMAT",
    "STATUS_KIND",
    "VARIABLES",
    "WEIGHTS",
    "ApiKey",
    "EngineSettings",
    "FlagError",
    "KeyFileError",
    "PlanError",
    "ProcessStatus",
    "RankResume",
    "ReleaseReport",
    "ResumePlan",
    "SettingsError",
    "StatusError",
    "StatusEvent",
    "key_path",
    "load_settings",
    "parse_flag",
    "parse_status",
    "plan_from",
    "read_key",
    "read_plan",
    "read_status",
    "read_status_as_written",
    "status_path",
    "unknown_variables",
    "write_key",
    "write_plan",
]
