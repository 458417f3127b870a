// SPDX-License-Identifier: GPL-2.0
/* modstage test module: another driver for QEMU's "edu" device, to take it first. */
#include <linux/init.h>
#include <linux/module.h>
#include <linux/pci.h>

static const struct pci_device_id ms_pci_rival_ids[] = {
	{ PCI_DEVICE(0x1234, 0x11e8) },
	{ }
};
MODULE_DEVICE_TABLE(pci, ms_pci_rival_ids);

static int ms_pci_rival_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	return 0;
}

static void ms_pci_rival_remove(struct pci_dev *pdev)
{
}

static struct pci_driver ms_pci_rival_driver = {
	.name = "ms_pci_rival",
	.id_table = ms_pci_rival_ids,
	.probe = ms_pci_rival_probe,
	.remove = ms_pci_rival_remove,
};

module_pci_driver(ms_pci_rival_driver);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("modstage test: a rival PCI driver for QEMU's edu device");
