// SPDX-License-Identifier: GPL-2.0
/*
 * modstage test module: a PCI driver for QEMU's "edu" device (1234:11e8).
 *
 * With require_device=1 its init fails with -ENODEV when no device was bound
 * during pci_register_driver(), as the NVIDIA driver's init does without a GPU
 * ("NVRM: No NVIDIA GPU found.").
 */
#include <linux/errno.h>
#include <linux/init.h>
#include <linux/module.h>
#include <linux/pci.h>

static bool require_device;
module_param(require_device, bool, 0444);
MODULE_PARM_DESC(require_device, "fail init with -ENODEV when no device was bound");

static int probed;

static const struct pci_device_id ms_pci_ids[] = {
	{ PCI_DEVICE(0x1234, 0x11e8) },
	{ }
};
MODULE_DEVICE_TABLE(pci, ms_pci_ids);

static int ms_pci_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	probed++;
	dev_info(&pdev->dev, "ms_pci: bound\n");
	return 0;
}

static void ms_pci_remove(struct pci_dev *pdev)
{
	probed--;
}

static struct pci_driver ms_pci_driver = {
	.name = "ms_pci",
	.id_table = ms_pci_ids,
	.probe = ms_pci_probe,
	.remove = ms_pci_remove,
};

static int __init ms_pci_init(void)
{
	int err = pci_register_driver(&ms_pci_driver);

	if (err)
		return err;
	if (require_device && !probed) {
		pr_info("ms_pci: no device found\n");
		pci_unregister_driver(&ms_pci_driver);
		return -ENODEV;
	}
	return 0;
}

static void __exit ms_pci_exit(void)
{
	pci_unregister_driver(&ms_pci_driver);
}

module_init(ms_pci_init);
module_exit(ms_pci_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("modstage test: PCI driver for QEMU's edu device");
