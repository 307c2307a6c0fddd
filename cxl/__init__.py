"""kvcxl.cxl: the protocol tables, one module per protocol, below the device and the host.

``mem`` — CXL.mem messages (M2S Req/RwD, S2M NDR/DRS): classes, fields, widths,
opcodes, byte encoding; ``mailbox`` — the CCI mailbox command table (its rows name the
handler and whether a patched QEMU forwards the command), return codes and message
framing; ``hdm`` — the HDM decoder register encodings and the decoders' rules (HPA →
DPA); ``ring`` — the device-memory protocol between the guest agent and the firmware
service, and the CXL.mem request ring between a patched QEMU and the device;
``guest_header`` — the guest agent's C header, generated from ``ring``.  They are
data, their encoding and the rules that follow from them only (standard library and
numpy), so the emulator's device, the RTL, the testbench and the virtual host all import
them from here and none of them defines a second copy.
"""
