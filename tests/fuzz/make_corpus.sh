#!/bin/bash
# make_corpus.sh - writes the seed corpus of fuzz_wire into corpus/: valid and broken
# handshakes, replies, frame headers, same-host messages and endpoints (layouts in
# src/comm/wire.h). Rerun after a wire format change; the files are committed.
set -e
cd "$(dirname "$0")/corpus"
le16() { printf '%b' "$(printf '\\x%02x\\x%02x' $(($1 & 255)) $(($1 >> 8 & 255)))"; }
le32() { le16 $(($1 & 0xffff)); le16 $(($1 >> 16 & 0xffff)); }
le64() { le32 $(($1 & 0xffffffff)); le32 $(($1 >> 32 & 0xffffffff)); }
pad() { head -c "$1" /dev/zero; }                    # n zero bytes
token() { printf '%s' "$1"; pad $((64 - ${#1})); }   # a 64-byte NUL-padded token
hello() { printf 'FLET'; le16 "$1"; le16 "$2"; le32 "$3"; le32 "$4"; token "$5"; }
frame() { printf 'FLFR'; le32 "$1"; le64 "$2"; le64 "$3"; }

hello 1 0 1 4 fuzz-token > hello_ok
hello 1 1 3 4 "" > hello_rendezvous
hello 3 0 1 4 fuzz-token > hello_bad_version
hello 1 0 7 4 fuzz-token > hello_bad_rank
hello 1 0 1 4 fuzz-tokeN > hello_bad_token
hello 1 0 1 4 fuzz-token | head -c 40 > hello_truncated
{ printf 'FLET'; le16 1; le16 0; le32 0; le32 1; } > reply_ok
{ printf 'FLET'; le16 1; le16 0; le32 5; le32 1; } > reply_refused
{ frame 1 0 7; printf 'payload'; } > frame_data
{ frame 2 0 20; printf '0:rank 1 (h:1) reset'; } > frame_abort
frame 3 0 0 > frame_keepalive
frame 1 0 4611686018427387904 > frame_huge
frame 1 9 7 > frame_bad_seq
{ printf 'FLLO'; le32 1; printf 'fleet-0123456789abcdef'; pad 2; printf '0123456789abcdef'; } > local_offer
{ printf 'FLLD'; le32 1; } > local_decision
{ printf 'FLLP'; le32 2; printf '0123456789abcdef'; } > local_proof
printf '127.0.0.1:6170' > endpoint_v4
printf '[fe80::1%%eth0]:29500' > endpoint_v6
printf 'localhost:abc' > endpoint_bad
