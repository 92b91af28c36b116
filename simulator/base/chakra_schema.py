"""Chakra's execution-trace schema (MLCommons Chakra, ``schema/protobuf/et_def.proto``,
package ``ChakraProtoMsg``), written here from its documentation as protobuf
descriptors, so no generated code or ``protoc`` is needed: the messages a trace
file holds (``GlobalMetadata``, then ``Node`` after ``Node``, each prefixed by
its length as a varint) with the field numbers of the published schema. Only
the fields clustersim reads or writes are declared; a reader keeps the others
as unknown fields, so the files stay wire-compatible both ways.

Node types: ``COMP_NODE`` (compute), ``COMM_COLL_NODE`` (a collective),
``COMM_SEND_NODE`` and ``COMM_RECV_NODE`` (point to point); dependencies are
``data_deps`` and ``ctrl_deps`` (ids of earlier nodes of the same file);
attributes (``AttributeProto``) carry the rest (``comm_type``, ``comm_size``,
``pg_name``, ``comm_src``, ``comm_dst``, ``comm_tag``, ``num_ops``,
``tensor_size``, ``is_cpu_op``, as ASTRA-sim reads them).
"""

from __future__ import annotations

from functools import cache

NODE_TYPES = {"INVALID_NODE": 0, "METADATA_NODE": 1, "MEM_LOAD_NODE": 2, "MEM_STORE_NODE": 3,
              "COMP_NODE": 4, "COMM_SEND_NODE": 5, "COMM_RECV_NODE": 6, "COMM_COLL_NODE": 7}
COLLECTIVES = {"ALL_REDUCE": 0, "REDUCE": 1, "ALL_GATHER": 2, "GATHER": 3, "SCATTER": 4,
               "BROADCAST": 5, "ALL_TO_ALL": 6, "REDUCE_SCATTER": 7,
               "REDUCE_SCATTER_BLOCK": 8, "BARRIER": 9}
# AttributeProto's value fields clustersim uses: (name, number, type, message of a list)
VALUES = (("double_val", 3, "double", None), ("double_list", 4, None, "DoubleList"),
          ("int32_val", 7, "int32", None), ("int64_val", 9, "int64", None),
          ("int64_list", 10, None, "Int64List"), ("uint64_val", 13, "uint64", None),
          ("bool_val", 27, "bool", None), ("bool_list", 28, None, "BoolList"),
          ("string_val", 29, "string", None), ("string_list", 30, None, "StringList"))
LISTS = {"DoubleList": "double", "Int64List": "int64", "BoolList": "bool",
         "StringList": "string"}


@cache
def messages() -> dict[str, type]:
    """The message classes: ``GlobalMetadata``, ``Node``, ``AttributeProto`` and
    the list messages."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="clustersim/et_def.proto",
                                               package="ChakraProtoMsg", syntax="proto3")
    for name, values in (("NodeType", NODE_TYPES), ("CollectiveCommType", COLLECTIVES)):
        enum = proto.enum_type.add(name=name)
        for key, number in values.items():
            enum.value.add(name=key, number=number)
    for name, kind in LISTS.items():
        _field(proto.message_type.add(name=name), "values", 1, kind, repeated=True)
    attr = proto.message_type.add(name="AttributeProto")
    _field(attr, "name", 1, "string")
    _field(attr, "doc_string", 2, "string")
    attr.oneof_decl.add(name="value")
    for name, number, kind, message in VALUES:
        _field(attr, name, number, kind, message=message, oneof=0)
    meta = proto.message_type.add(name="GlobalMetadata")
    _field(meta, "version", 1, "string")
    _field(meta, "attr", 2, None, repeated=True, message="AttributeProto")
    io = proto.message_type.add(name="IOInfo")
    for number, name in enumerate(("values", "shapes", "types"), start=1):
        _field(io, name, number, "string")
    node = proto.message_type.add(name="Node")
    for name, number, kind, repeated in (("id", 1, "uint64", False), ("name", 2, "string", False),
                                         ("ctrl_deps", 4, "uint64", True),
                                         ("data_deps", 5, "uint64", True),
                                         ("start_time_micros", 6, "uint64", False),
                                         ("duration_micros", 7, "uint64", False)):
        _field(node, name, number, kind, repeated=repeated)
    _field(node, "type", 3, "enum", message="NodeType")
    _field(node, "inputs", 8, None, message="IOInfo")
    _field(node, "outputs", 9, None, message="IOInfo")
    _field(node, "attr", 10, None, repeated=True, message="AttributeProto")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {m.name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"ChakraProtoMsg.{m.name}")) for m in proto.message_type}


def _field(owner, name: str, number: int, kind: str | None, repeated: bool = False,
           message: str | None = None, oneof: int | None = None) -> None:
    """Declare a field of ``owner`` (``kind``: a scalar type's name, ``enum``, or
    None for a message field; ``message``: the message or enum it holds)."""
    from google.protobuf import descriptor_pb2

    F = descriptor_pb2.FieldDescriptorProto
    field = owner.field.add(name=name, number=number,
                            label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
    if kind == "enum":
        field.type, field.type_name = F.TYPE_ENUM, f".ChakraProtoMsg.{message}"
    elif kind is None:
        field.type, field.type_name = F.TYPE_MESSAGE, f".ChakraProtoMsg.{message}"
    else:
        field.type = getattr(F, f"TYPE_{kind.upper()}")
    if oneof is not None:
        field.oneof_index = oneof


def varint(value: int) -> bytes:
    """``value`` as a protobuf varint (the length before each message).

    >>> varint(1), varint(300)
    (b'\\x01', b'\\xac\\x02')
    """
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def delimited(data: bytes) -> list[bytes]:
    """The messages of a file of length-prefixed messages; ValueError if cut.

    >>> delimited(varint(2) + b"ab" + varint(1) + b"c")
    [b'ab', b'c']
    """
    out, at = [], 0
    while at < len(data):
        length = shift = 0
        while True:
            if at >= len(data) or shift > 63:
                raise ValueError(f"a message length is cut at byte {at}")
            byte = data[at]
            at += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if at + length > len(data):
            raise ValueError(f"a message at byte {at} claims {length} bytes; "
                             f"{len(data) - at} are left")
        out.append(data[at: at + length])
        at += length
    return out
