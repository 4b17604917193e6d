"""coldsnap's SGLang plugin: the code that runs inside SGLang's own processes.

Installed as the entry point `coldsnap` of group `sglang.srt.plugins` and enabled with
`SGLANG_PLUGINS=coldsnap` plus `COLDSNAP_MODE=capture|restore`. It meets the orchestrator
only through SGLang's HTTP endpoints and the files under COLDSNAP_RUNTIME_DIR (status
records it writes, the resume plan it reads: coldsnap._wire); it never imports
coldsnap.machine.
"""

from coldsnap._wire import VARIABLES, SettingsError, load_settings, unknown_variables
from coldsnap._wire import EngineSettings as Settings

from ._contracts import (
    CONTRACTS,
    GROUPS,
    Contract,
    ContractError,
    Report,
    admit,
    check,
    contract_files,
    describe,
    digest,
    plugin_digest,
    plugin_files,
    report,
    variant_in_use,
    variants_checked,
)
from ._install import HookNotLanded, hook_landed, install, landed_hooks, process_role, register
from ._memory import (
    ColdsnapMemorySaverAdapter,
    HostDiscardBackend,
    MemoryBackendError,
    discard_pages,
)
from ._records import StatusFile
from ._storages import REGISTRY, RegistryError, StorageRegistry, TensorRecord

__all__ = [
    "CONTRACTS",
    "GROUPS",
    "REGISTRY",
    "VARIABLES",
    "ColdsnapMemorySaverAdapter",
    "Contract",
    "ContractError",
    "HookNotLanded",
    "HostDiscardBackend",
    "MemoryBackendError",
    "RegistryError",
    "Report",
    "Settings",
    "SettingsError",
    "StatusFile",
    "StorageRegistry",
    "TensorRecord",
    "admit",
    "check",
    "contract_files",
    "describe",
    "digest",
    "discard_pages",
    "hook_landed",
    "install",
    "landed_hooks",
    "load_settings",
    "plugin_digest",
    "plugin_files",
    "process_role",
    "register",
    "report",
    "unknown_variables",
    "variant_in_use",
    "variants_checked",
]
