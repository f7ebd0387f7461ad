"""The Kivy app on the device: Record, Live and Federation screens over a UI-free controller."""
