"""Just enough of the protobuf wire format to speak gRPC's standard health
and reflection services without their generated stubs (Debian ships neither
health.proto nor reflection.proto, nor grpcio-health-checking).

Field numbers are those of grpc/src/proto/grpc/health/v1/health.proto and
grpc/src/proto/grpc/reflection/v1alpha/reflection.proto. Not a test module.
"""

from typing import Dict, List, Union

# grpc.health.v1.HealthCheckResponse.ServingStatus
UNKNOWN, SERVING, NOT_SERVING, SERVICE_UNKNOWN = 0, 1, 2, 3

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def string_field(number: int, value: Union[str, bytes]) -> bytes:
    """A length-delimited field (wire type 2)."""
    data = value.encode() if isinstance(value, str) else value
    return varint(number << 3 | 2) + varint(len(data)) + data


def parse(data: bytes) -> Dict[int, List[Union[int, bytes]]]:
    """Field number -> values (varints as int, length-delimited as bytes)."""
    fields: Dict[int, List[Union[int, bytes]]] = {}
    i = 0

    def read_varint():
        nonlocal i
        shift = result = 0
        while True:
            b = data[i]
            i += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return result

    while i < len(data):
        key = read_varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            value: Union[int, bytes] = read_varint()
        elif wire == 2:
            n = read_varint()
            value = data[i:i + n]
            i += n
        else:
            raise ValueError(f"wire type {wire} not expected in these messages")
        fields.setdefault(number, []).append(value)
    return fields


def health_request(service: str = "") -> bytes:
    """HealthCheckRequest{service}: field 1."""
    return string_field(1, service) if service else b""


def health_status(response: bytes) -> int:
    """HealthCheckResponse.status (field 1; absent = UNKNOWN)."""
    return parse(response).get(1, [UNKNOWN])[0]


def list_services_request() -> bytes:
    """ServerReflectionRequest{list_services: ""}: field 7."""
    return string_field(7, "")


def file_containing_symbol_request(symbol: str) -> bytes:
    """ServerReflectionRequest{file_containing_symbol}: field 4."""
    return string_field(4, symbol)


def listed_services(response: bytes) -> List[str]:
    """ServerReflectionResponse.list_services_response (6) -> service (1) -> name (1)."""
    listing = parse(response)[6][0]
    return sorted(parse(s)[1][0].decode() for s in parse(listing).get(1, []))


def file_descriptors(response: bytes) -> List[bytes]:
    """ServerReflectionResponse.file_descriptor_response (4) -> file_descriptor_proto (1)."""
    return list(parse(parse(response)[4][0]).get(1, []))
