/* CRC32 (IEEE 802.3, reflected), slicing-by-8: zip stores it for every entry. */
#include "torch/torch_internal.h"

void ks__crc32_init(ks__crc32 *c) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t v = i;
    for (int k = 0; k < 8; k++) v = (v & 1) ? (v >> 1) ^ 0xEDB88320u : v >> 1;
    c->t[0][i] = v;
  }
  for (int s = 1; s < 8; s++)
    for (int i = 0; i < 256; i++) c->t[s][i] = (c->t[s - 1][i] >> 8) ^ c->t[0][c->t[s - 1][i] & 0xFF];
}

uint32_t ks__crc32_update(const ks__crc32 *c, uint32_t crc, const void *p, size_t n) {
  const uint8_t *b = p;
  crc = ~crc;
  while (n >= 8) {
    uint32_t lo = crc ^ ks__le32(b), hi = ks__le32(b + 4);
    crc = c->t[7][lo & 0xFF] ^ c->t[6][(lo >> 8) & 0xFF] ^ c->t[5][(lo >> 16) & 0xFF] ^
          c->t[4][lo >> 24] ^ c->t[3][hi & 0xFF] ^ c->t[2][(hi >> 8) & 0xFF] ^
          c->t[1][(hi >> 16) & 0xFF] ^ c->t[0][hi >> 24];
    b += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ c->t[0][(crc ^ *b++) & 0xFF];
  return ~crc;
}
