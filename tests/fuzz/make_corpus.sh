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
nonce() { printf '%s' "0123456789abcdef0123456789abcdef"; }   # 32 bytes
# hello VERSION FLAGS RANK SIZE ROUND OPTIONS
hello() { printf 'FLET'; le16 "$1"; le16 "$2"; le32 "$3"; le32 "$4"; le32 "$5"; le32 "$6"; nonce; }
challenge() { printf 'FLET'; le16 2; le16 0; le32 0; le32 "$1"; le32 "$2"; le32 0; nonce; nonce; }
auth() { printf 'FLAU'; le32 "$1"; nonce; }
frame() { printf 'FLFR'; le32 "$1"; le64 "$2"; le64 "$3"; }

rm -f hello_bad_token
hello 2 0 1 4 0 10 > hello_ok
hello 2 1 3 4 1 2 > hello_rendezvous
hello 2 2 3 4 0 8 > hello_msg
hello 1 0 1 4 0 0 > hello_bad_version
hello 2 0 7 4 0 0 > hello_bad_rank
hello 2 0 1 4 0 3 > hello_bad_options
hello 2 0 1 4 0 0 | head -c 40 > hello_truncated
challenge 1 8 > challenge_ok
challenge 1 8 | head -c 50 > challenge_truncated
auth 2 > auth_ok
{ printf 'FLET'; le16 2; le16 0; le32 0; le32 1; } > reply_ok
{ printf 'FLET'; le16 2; le16 0; le32 5; le32 1; } > reply_refused
{ printf 'FLET'; le16 1; le16 0; le32 3; le32 1; } > reply_old_version
{ frame 1 0 7; printf 'payload'; } > frame_data
{ frame 2 0 20; printf '0:rank 1 (h:1) reset'; } > frame_abort
frame 3 0 0 > frame_keepalive
{ frame 3 5 0; le64 7; printf '0123456789abcdef'; } > frame_keepalive_sealed
{ frame 3 5 0; le32 7; } > frame_keepalive_sealed_truncated
frame 1 0 4611686018427387904 > frame_huge
frame 1 9 7 > frame_bad_seq
{ printf 'FLLO'; le32 1; printf 'fleet-0123456789abcdef'; pad 2; printf '0123456789abcdef'; } > local_offer
{ printf 'FLLD'; le32 1; } > local_decision
{ printf 'FLLP'; le32 2; printf '0123456789abcdef'; } > local_proof
printf '127.0.0.1:6170' > endpoint_v4
printf '[fe80::1%%eth0]:29500' > endpoint_v6
printf 'localhost:abc' > endpoint_bad
