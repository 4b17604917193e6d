"""The root of coldsnap's exception tree. It imports nothing, so that every package (the plugin
inside SGLang's processes and the backends included) can derive from it.

The tree, by what the caller does next:

* ColdsnapError                     anything coldsnap raises on purpose
  + DefinitionError                 a spec, registry entry or component is wrong: fix the code
    - SpecError, RegistryError, ComponentError (coldsnap.machine)
  + RequestError                    a request is malformed or refers to what is not there
  + OperationError                  a step could not do its work
    - StepTimeout, Cancelled, IllegalTransition, JournalError (coldsnap.machine)
    - EngineError, AcceptanceError (coldsnap.engines)
    - BackendError: CriuError, PidCollision, GpuMappingFound, LaunchError, CudaCheckpointError
    - ProviderError: PackDamaged, LayoutMismatch, HydrationFailed, CheckpointError
  + RefusedError                    integrity or compatibility refuses to go on
    - ArtifactError: RecordError, StoreError, IntegrityError, IncompatibleArtifact
  + PluginError                     the plugin inside the engine fails closed
    - ContractError, SettingsError, HookNotLanded, ...

Package bases keep a builtin second parent where callers rely on one (`RequestError` and
`RecordError` are also `ValueError`).

Across the branches, `EnvironmentMissing` marks an error that says this host lacks what the
operation needs (CRIU, an engine install): the command line exits 5 for it. A receipt keeps
the branch of the error that ended its operation (coldsnap.machine.ErrorRecord), so callers
act on the branch instead of parsing class names out of a message.
"""

from __future__ import annotations


class ColdsnapError(Exception):
    """Base of every error coldsnap raises on purpose."""


class DefinitionError(ColdsnapError):
    """A spec, a registration or a component is malformed: a programming error, found early."""


class OperationError(ColdsnapError):
    """A step of an operation could not do its work."""


class RefusedError(ColdsnapError):
    """Integrity or compatibility checks refuse to go on."""


class PluginError(ColdsnapError):
    """The plugin inside the engine's processes refuses to go on."""


class EnvironmentMissing(ColdsnapError):
    """Mixed into an error of any branch that says this host lacks what the operation needs
    (CRIU, an engine install), not that the operation or its request is wrong."""


__all__ = [
    "ColdsnapError",
    "DefinitionError",
    "EnvironmentMissing",
    "OperationError",
    "PluginError",
    "RefusedError",
]
