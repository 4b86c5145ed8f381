/* devsim_install.c - makes the guarded device stand-in (devsim.h) the backend that
 * train.device: gpu trains on, before main runs: linked into fleet-train-devsim and
 * fleet-eval-devsim, it turns the real tools into tests of every device path of the trainer
 * (batches copied to the device, accuracy from copied logits, staged comm, checkpoints through
 * host copies, the device bound from FLAGS_selected_gpus) on a machine without a GPU. */
#include "support/devsim.h"

#include "fleet/train.h"

__attribute__((constructor)) static void install_devsim(void) {
    fl_train_set_gpu_backend(fl_devsim_backend());
}
