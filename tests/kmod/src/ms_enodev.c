// SPDX-License-Identifier: GPL-2.0
/* modstage test module: init fails with -ENODEV, as a driver without hardware does. */
#include <linux/errno.h>
#include <linux/init.h>
#include <linux/module.h>

static int __init ms_enodev_init(void)
{
	return -ENODEV;
}

module_init(ms_enodev_init);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("modstage test: init returns -ENODEV");
