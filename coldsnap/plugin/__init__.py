"""coldsnap's SGLang plugin: the code that runs inside SGLang's own processes.

Installed as the entry point `coldsnap` of group `sglang.srt.plugins` and enabled with
`SGLANG_PLUGINS=coldsnap` plus `COLDSNAP_MODE=capture|restore`. It meets the orchestrator
only through SGLang's HTTP endpoints and the files under COLDSNAP_RUNTIME_DIR (status
records it writes, the resume plan it reads); it never imports coldsnap.machine.
"""

from ._contracts import (
    CONTRACTS,
    GROUPS,
    Contract,
    ContractError,
    admit,
    check,
    describe,
    digest,
    plugin_digest,
)
from ._install import HookNotLanded, hook_landed, install, landed_hooks, process_role, register
from ._memory import (
    ColdsnapMemorySaverAdapter,
    HostDiscardBackend,
    MemoryBackendError,
    discard_pages,
)
from ._records import (
    PLAN_FILE,
    PLAN_KIND,
    STATUS_KIND,
    PlanError,
    ResumePlan,
    StatusFile,
    read_plan,
    status_path,
    write_plan,
)
from ._settings import VARIABLES, Settings, SettingsError, load_settings, unknown_variables
from ._storages import REGISTRY, RegistryError, StorageRegistry, TensorRecord

__all__ = [
    "CONTRACTS",
    "GROUPS",
    "PLAN_FILE",
    "PLAN_KIND",
    "REGISTRY",
    "STATUS_KIND",
    "VARIABLES",
    "ColdsnapMemorySaverAdapter",
    "Contract",
    "ContractError",
    "HookNotLanded",
    "HostDiscardBackend",
    "MemoryBackendError",
    "PlanError",
    "RegistryError",
    "ResumePlan",
    "Settings",
    "SettingsError",
    "StatusFile",
    "StorageRegistry",
    "TensorRecord",
    "admit",
    "check",
    "describe",
    "digest",
    "discard_pages",
    "hook_landed",
    "install",
    "landed_hooks",
    "load_settings",
    "plugin_digest",
    "process_role",
    "read_plan",
    "register",
    "status_path",
    "unknown_variables",
    "write_plan",
]
