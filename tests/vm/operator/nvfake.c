// SPDX-License-Identifier: GPL-2.0
/*
 * modstage test module standing in for one of NVIDIA's (built as nvidia, nvidia-uvm and
 * nvidia-modeset): MODULE_VERSION is the driver version the GPU operator's driver
 * container compares with /sys/module/nvidia/version; fail=1 makes init fail with -ENODEV.
 * It declares its GSP image as NVIDIA's nvidia.ko declares its own (MODULE_FIRMWARE), so
 * intake takes the image's firmware/nvidia/<version>/gsp_test.bin as the bundle's own.
 */
#include <linux/errno.h>
#include <linux/init.h>
#include <linux/module.h>

static bool fail;
module_param(fail, bool, 0444);
MODULE_PARM_DESC(fail, "make init fail with -ENODEV");

static int __init nvfake_init(void)
{
	return fail ? -ENODEV : 0;
}

static void __exit nvfake_exit(void)
{
}

module_init(nvfake_init);
module_exit(nvfake_exit);
MODULE_LICENSE("GPL");
MODULE_VERSION(NV_VERSION);
MODULE_FIRMWARE("nvidia/" NV_VERSION "/gsp_test.bin");
MODULE_DESCRIPTION("modstage test: stands in for an NVIDIA module");
