/* The AMQP message decoder: bytes as a peer would send them in a transfer, through
 * proton's decoder into nh_amqp_msg_decode (properties, annotations, body). */
#include "nh_fuzz.h"
#include "core/nh_msg.h"
#include "transport/nh_amqp_int.h"

#include <proton/message.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  pn_message_t *pm = pn_message();
  if (nh_amqp_msg_decode_bytes(pm, (const char *)data, size) == NH_OK) {
    nh_msg_t m;
    memset(&m, 0, sizeof m);
    nh_amqp_msg_decode(pm, "Ep", &m);
    char id[37];
    if (m.message_id) nh_amqp_event_id("Ep", m.message_id, m.enqueued_at, id);
    nh_msg_clear(&m);
  }
  pn_message_free(pm);
  return 0;
}
