from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "encoding", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    encoding: str
    data: bytes
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., encoding: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class Transform(_message.Message):
    __slots__ = ("stage", "name", "tier", "bits", "params")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STAGE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    BITS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    stage: str
    name: str
    tier: str
    bits: int
    params: _containers.ScalarMap[str, float]
    def __init__(self, stage: _Optional[str] = ..., name: _Optional[str] = ..., tier: _Optional[str] = ..., bits: _Optional[int] = ..., params: _Optional[_Mapping[str, float]] = ...) -> None: ...

class Meta(_message.Message):
    __slots__ = ("run_id", "round", "phase", "step", "sender_id", "num_samples", "transforms", "num_devices", "attempt", "withdraw")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SENDER_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TRANSFORMS_FIELD_NUMBER: _ClassVar[int]
    NUM_DEVICES_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WITHDRAW_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    round: int
    phase: str
    step: int
    sender_id: str
    num_samples: int
    transforms: _containers.RepeatedCompositeFieldContainer[Transform]
    num_devices: int
    attempt: int
    withdraw: bool
    def __init__(self, run_id: _Optional[str] = ..., round: _Optional[int] = ..., phase: _Optional[str] = ..., step: _Optional[int] = ..., sender_id: _Optional[str] = ..., num_samples: _Optional[int] = ..., transforms: _Optional[_Iterable[_Union[Transform, _Mapping]]] = ..., num_devices: _Optional[int] = ..., attempt: _Optional[int] = ..., withdraw: bool = ...) -> None: ...

class Phase(_message.Message):
    __slots__ = ("kind", "params")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    params: _containers.ScalarMap[str, float]
    def __init__(self, kind: _Optional[str] = ..., params: _Optional[_Mapping[str, float]] = ...) -> None: ...

class NoiseInstruction(_message.Message):
    __slots__ = ("tier", "stream", "shape", "multiplier", "sensitivity", "clip", "clip_at", "calibration")
    TIER_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    SENSITIVITY_FIELD_NUMBER: _ClassVar[int]
    CLIP_FIELD_NUMBER: _ClassVar[int]
    CLIP_AT_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    tier: str
    stream: str
    shape: str
    multiplier: float
    sensitivity: float
    clip: float
    clip_at: _containers.RepeatedScalarFieldContainer[str]
    calibration: str
    def __init__(self, tier: _Optional[str] = ..., stream: _Optional[str] = ..., shape: _Optional[str] = ..., multiplier: _Optional[float] = ..., sensitivity: _Optional[float] = ..., clip: _Optional[float] = ..., clip_at: _Optional[_Iterable[str]] = ..., calibration: _Optional[str] = ...) -> None: ...

class DevicePlan(_message.Message):
    __slots__ = ("params", "noise")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    NOISE_FIELD_NUMBER: _ClassVar[int]
    params: _containers.ScalarMap[str, float]
    noise: _containers.RepeatedCompositeFieldContainer[NoiseInstruction]
    def __init__(self, params: _Optional[_Mapping[str, float]] = ..., noise: _Optional[_Iterable[_Union[NoiseInstruction, _Mapping]]] = ...) -> None: ...

class ClusterPlan(_message.Message):
    __slots__ = ("params", "participants", "devices", "only_listed", "noise")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class DevicesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: DevicePlan
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[DevicePlan, _Mapping]] = ...) -> None: ...
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    ONLY_LISTED_FIELD_NUMBER: _ClassVar[int]
    NOISE_FIELD_NUMBER: _ClassVar[int]
    params: _containers.ScalarMap[str, float]
    participants: _containers.RepeatedScalarFieldContainer[str]
    devices: _containers.MessageMap[str, DevicePlan]
    only_listed: bool
    noise: _containers.RepeatedCompositeFieldContainer[NoiseInstruction]
    def __init__(self, params: _Optional[_Mapping[str, float]] = ..., participants: _Optional[_Iterable[str]] = ..., devices: _Optional[_Mapping[str, DevicePlan]] = ..., only_listed: bool = ..., noise: _Optional[_Iterable[_Union[NoiseInstruction, _Mapping]]] = ...) -> None: ...

class RoundTask(_message.Message):
    __slots__ = ("round", "phases", "finished", "attempt", "clusters")
    class ClustersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ClusterPlan
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ClusterPlan, _Mapping]] = ...) -> None: ...
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    round: int
    phases: _containers.RepeatedCompositeFieldContainer[Phase]
    finished: bool
    attempt: int
    clusters: _containers.MessageMap[str, ClusterPlan]
    def __init__(self, round: _Optional[int] = ..., phases: _Optional[_Iterable[_Union[Phase, _Mapping]]] = ..., finished: bool = ..., attempt: _Optional[int] = ..., clusters: _Optional[_Mapping[str, ClusterPlan]] = ...) -> None: ...

class Envelope(_message.Message):
    __slots__ = ("meta", "tensors", "scalars", "task", "members", "air", "relay")
    class ScalarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    META_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    SCALARS_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    AIR_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    meta: Meta
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    scalars: _containers.ScalarMap[str, float]
    task: RoundTask
    members: _containers.RepeatedCompositeFieldContainer[MemberState]
    air: AirBatch
    relay: RelayBatch
    def __init__(self, meta: _Optional[_Union[Meta, _Mapping]] = ..., tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., scalars: _Optional[_Mapping[str, float]] = ..., task: _Optional[_Union[RoundTask, _Mapping]] = ..., members: _Optional[_Iterable[_Union[MemberState, _Mapping]]] = ..., air: _Optional[_Union[AirBatch, _Mapping]] = ..., relay: _Optional[_Union[RelayBatch, _Mapping]] = ...) -> None: ...

class AirRow(_message.Message):
    __slots__ = ("node", "mu", "sigma", "model_sum", "tensor")
    NODE_FIELD_NUMBER: _ClassVar[int]
    MU_FIELD_NUMBER: _ClassVar[int]
    SIGMA_FIELD_NUMBER: _ClassVar[int]
    MODEL_SUM_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    node: str
    mu: float
    sigma: float
    model_sum: float
    tensor: Tensor
    def __init__(self, node: _Optional[str] = ..., mu: _Optional[float] = ..., sigma: _Optional[float] = ..., model_sum: _Optional[float] = ..., tensor: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class AirBatch(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[AirRow]
    def __init__(self, rows: _Optional[_Iterable[_Union[AirRow, _Mapping]]] = ...) -> None: ...

class RelayBatch(_message.Message):
    __slots__ = ("uploads",)
    UPLOADS_FIELD_NUMBER: _ClassVar[int]
    uploads: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, uploads: _Optional[_Iterable[bytes]] = ...) -> None: ...

class MemberState(_message.Message):
    __slots__ = ("id", "state", "last_seen_s", "refused", "round_s", "rejoins")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_S_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    ROUND_S_FIELD_NUMBER: _ClassVar[int]
    REJOINS_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: int
    last_seen_s: float
    refused: int
    round_s: float
    rejoins: int
    def __init__(self, id: _Optional[str] = ..., state: _Optional[int] = ..., last_seen_s: _Optional[float] = ..., refused: _Optional[int] = ..., round_s: _Optional[float] = ..., rejoins: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("data", "end")
    DATA_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    end: bool
    def __init__(self, data: _Optional[bytes] = ..., end: bool = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("run_id", "node_id", "num_samples", "rejoin", "trust", "nonce")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    REJOIN_FIELD_NUMBER: _ClassVar[int]
    TRUST_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node_id: str
    num_samples: int
    rejoin: bool
    trust: str
    nonce: bytes
    def __init__(self, run_id: _Optional[str] = ..., node_id: _Optional[str] = ..., num_samples: _Optional[int] = ..., rejoin: bool = ..., trust: _Optional[str] = ..., nonce: _Optional[bytes] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("run_id", "spec_json", "cluster_id", "members", "session_token", "round")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    spec_json: str
    cluster_id: str
    members: _containers.RepeatedScalarFieldContainer[str]
    session_token: str
    round: int
    def __init__(self, run_id: _Optional[str] = ..., spec_json: _Optional[str] = ..., cluster_id: _Optional[str] = ..., members: _Optional[_Iterable[str]] = ..., session_token: _Optional[str] = ..., round: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("run_id", "node_id", "after_round", "after_attempt", "also")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_ROUND_FIELD_NUMBER: _ClassVar[int]
    AFTER_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ALSO_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node_id: str
    after_round: int
    after_attempt: int
    also: _containers.RepeatedCompositeFieldContainer[FetchFor]
    def __init__(self, run_id: _Optional[str] = ..., node_id: _Optional[str] = ..., after_round: _Optional[int] = ..., after_attempt: _Optional[int] = ..., also: _Optional[_Iterable[_Union[FetchFor, _Mapping]]] = ...) -> None: ...

class FetchFor(_message.Message):
    __slots__ = ("node_id", "session_token")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    session_token: str
    def __init__(self, node_id: _Optional[str] = ..., session_token: _Optional[str] = ...) -> None: ...

class PresenceRequest(_message.Message):
    __slots__ = ("run_id", "node_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    node_id: str
    def __init__(self, run_id: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class PresenceEvent(_message.Message):
    __slots__ = ("round",)
    ROUND_FIELD_NUMBER: _ClassVar[int]
    round: int
    def __init__(self, round: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("accepted", "detail")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    detail: str
    def __init__(self, accepted: bool = ..., detail: _Optional[str] = ...) -> None: ...
