"""Discovery: candidate peers from mDNS adverts, the inventory and seeds, fed to membership."""
