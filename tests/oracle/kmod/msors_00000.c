// SPDX-License-Identifier: GPL-2.0
/*
 * modstage oracle symbols module: the control of the "symbols" cases. It imports normal
 * vmlinux exports (_printk, jiffies), a GPL-only one (kobject_create_and_add), a GPL-only one
 * in the DMA_BUF namespace (dma_buf_put, imported with MODULE_IMPORT_NS) and a normal one
 * declared weak (strim). The cases rename, relicense or re-version these imports before signing.
 * Its name (msors_00000) is rewritten per case like the base module's.
 *
 * Only _printk is called. The other imports are addresses in a table the loader relocates
 * with R_X86_64_64, which also takes the address 0 of an unresolved weak symbol (a call's
 * PC-relative relocation to 0 would overflow and fail the load with ENOEXEC instead).
 */
#include <linux/dma-buf.h>
#include <linux/init.h>
#include <linux/jiffies.h>
#include <linux/kobject.h>
#include <linux/module.h>
#include <linux/string.h>
#include <linux/version.h>

extern typeof(strim) strim __attribute__((weak));

static const void *const msors_imports[] __used = {
	&jiffies,
	kobject_create_and_add,
	dma_buf_put,
	strim,
};

static int __init msors_init(void)
{
	pr_info("msors: %zu imports resolved\n", ARRAY_SIZE(msors_imports));
	return 0;
}

static void __exit msors_exit(void)
{
}

module_init(msors_init);
module_exit(msors_exit);
MODULE_LICENSE("GPL");
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0) /* the namespace became a string literal */
MODULE_IMPORT_NS("DMA_BUF");
#else
MODULE_IMPORT_NS(DMA_BUF);
#endif
MODULE_DESCRIPTION("modstage oracle symbols case");
