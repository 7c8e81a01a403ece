"""Generated protobuf/grpclib code (committed; never edit by hand).

``deviceplugin.v1beta1`` is the kubelet device plugin API (``proto/deviceplugin/v1beta1/api.proto``,
package ``v1beta1``): ``api_pb2`` holds the messages, ``api_grpc`` the grpclib ``RegistrationBase``,
``RegistrationStub``, ``DevicePluginBase`` and ``DevicePluginStub``.

Regenerate from the repository root with exactly this one command::

    .venv/bin/python -m grpc_tools.protoc -Ihamid/_proto=proto \
        --plugin=protoc-gen-grpclib_python=.venv/bin/protoc-gen-grpclib_python \
        --python_out=. --pyi_out=. --grpclib_python_out=. proto/deviceplugin/v1beta1/api.proto

The ``-Ihamid/_proto=proto`` mapping makes protoc write into ``hamid/_proto/deviceplugin/v1beta1/``
with imports spelled ``hamid._proto.deviceplugin.v1beta1.api_pb2``, so the package imports work
without any post-processing. The proto package stays ``v1beta1``, so the gRPC method paths are
``/v1beta1.DevicePlugin/...`` and ``/v1beta1.Registration/Register`` as kubelet expects.
"""
